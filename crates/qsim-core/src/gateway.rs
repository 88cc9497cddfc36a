//! The gateway: which upstream a request goes to, and what happens when an
//! upstream refuses, fails or goes quiet — as one sans-IO state machine
//! that the simulator (`qsim run` hosted experiments, `qsim options`
//! hybrids) and the live proxy (`qsim proxy`) both drive.
//!
//! A [`Config`] holds **upstreams** (each with its own provider limits,
//! concurrency cap, attempt timeout, cooldown, circuit breaker and health
//! probes) and **routes** (a model name → an ordered list of *tiers*, each
//! a set of upstreams chosen first-open-in-order or weighted at random).
//! A route's tiers are its own upstreams followed by those of its fallback
//! routes (flattened by the config loader; an upstream appears once per
//! route). The driver tells the gateway when a request starts, what each
//! attempt's reply was, and when a successful answer ended; the gateway
//! answers with the upstream to try next and its deadline, or that the
//! request is answered, or that nothing can take it now (and until when).
//!
//! # The rules
//!
//! **Open.** An upstream is *open* for a request at `now` when all hold:
//! 1. the request has not tried it yet (a request never goes to the same
//!    upstream twice);
//! 2. it is not cooling down (`now ≥ cooldown_until`);
//! 3. its circuit is closed, or half-open with a probe slot free (fewer
//!    than `breaker.probes` requests sent while half-open are unanswered);
//!    an open circuit becomes half-open at its `open until` time;
//! 4. fewer than `max_in_flight` requests sent to it are unanswered (when
//!    set; a success counts until its answer ends);
//! 5. its own provider limits ([`RateLimits`]: RPM, TPM, QPH, provisioned
//!    units…) would admit the request's cost now (all of them).
//!
//! **Choice.** The route's tiers are looked at in order; in the first tier
//! with an open upstream, the tier's [`Router`] chooses among its open
//! upstreams: [`Policy::First`] takes the first open one in the tier's
//! order (priority, spillover: the primary until its own limit or a 429,
//! then the next), [`Policy::Weighted`] draws in proportion to the weights
//! of the open ones (the driver's [`Below`] draw, only when two or more are
//! open). The chosen upstream's limits are charged the request's cost at
//! once (input tokens and `max_tokens` reserved, as the provider would),
//! its unanswered count goes up, and the driver gets
//! [`Step::Send`]` { upstream, deadline }` with `deadline = now +
//! timeout`: if no reply head has come by then, the driver reports
//! [`Reply::Timeout`].
//!
//! **Replies.** At most `max_attempts` attempts per request (sends), each
//! counted:
//! - [`Reply::Ok`] (2xx): the answer streams to the client; the upstream is
//!   healthy (consecutive failures 0; a half-open circuit closes, an open
//!   one not yet past its time stays open). The
//!   driver calls [`Gateway::finish`] with the output tokens when the
//!   answer ends: the limits are settled (unused reservation refunded),
//!   the unanswered count goes down. → [`Step::Answer`].
//! - [`Reply::ClientError`] (a 4xx other than 429): the request's own
//!   fault; not retried, not a health failure. → [`Step::Answer`].
//! - [`Reply::RateLimited`] (429): the upstream's real limit was hit: its
//!   cooldown's end becomes `max(end, now + hint)` (the reply's retry
//!   hint; `now + cooldown` without one); not a health failure (the
//!   breaker's count is unchanged; a half-open probe slot is freed).
//! - [`Reply::ServerError`] (5xx), [`Reply::Timeout`], [`Reply::Refused`]
//!   (no connection, or it closed before any answer): a health failure:
//!   its cooldown's end becomes `max(end, now + cooldown)`; its consecutive
//!   failures go up by one, and at `breaker.failures` (0: never) its
//!   circuit opens until `now + breaker.open_for`; a failure while
//!   half-open opens it again at once.
//!
//! After a 429 or a failure, the reservation is settled with no output and
//! the unanswered count goes down; then, if attempts are left, the next
//! upstream is chosen as above (→ [`Step::Send`]), and if none is open →
//! [`Step::Refuse`]; with no attempts left the reply is the answer (→
//! [`Step::Answer`]: the driver passes the upstream's answer on).
//!
//! **Refusal.** [`Step::Refuse`] carries why (`Limited`: the upstream that
//! opens first is closed by its own limits, its concurrency cap or a 429's
//! cooldown; `Unavailable`: by a failure's cooldown or its circuit; a
//! cooldown is a 429's when a 429 set its end last, a failure's when a
//! failure did, or on a tie) and the
//! earliest time an untried upstream of the route opens if nothing else
//! happens (`None` when that waits on a request ending: a concurrency cap,
//! a half-open probe, or a cost over an upstream's limit).
//!
//! **Probes.** An upstream with `probe_every` is probed (by the driver: an
//! HTTP GET, or the simulation's model of it) while it is unhealthy: from a
//! failure on, every `probe_every` ([`Gateway::poll_timeout`],
//! [`Gateway::due_probe`]). A probe that succeeds ends the failure's
//! cooldown, makes an open circuit half-open at once and stops the probes;
//! one that fails counts as a failure (cooldown, breaker) and the next is
//! due `probe_every` later.
//!
//! **Reloads.** [`Gateway::reconfigure`] puts a new config in force: an
//! upstream of the same name keeps its health, its unanswered count and,
//! when its limits are unchanged, its buckets (else fresh ones at `now`);
//! [`Gateway::translate`] maps a request's ticket from the old config to
//! the new one by names.
//!
//! ```text
//! let mut gw = Gateway::new(cfg, 0)?;
//! let (mut t, step) = gw.start(now, route, cost, &mut below);
//! // Step::Send { upstream, deadline } → send; later:
//! match gw.on_reply(now, &mut t, Reply::RateLimited { hint: None }, &mut below) { … }
//! gw.finish(now, &t, output_tokens);   // after Reply::Ok, when the answer ends
//! ```

use crate::limiter::rates::{Cost, LimitSpec, RateLimits};
use crate::route::{Below, Policy, Router, Targets};
use crate::time::{Nanos, NEVER};

/// The most upstreams one route may hold (a request's tried set is a
/// bitmask).
pub const MAX_ROUTE_UPSTREAMS: usize = 64;

/// The route that takes every model no other route names.
pub const ANY_MODEL: &str = "*";

/// A circuit breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    /// Consecutive failures that open the circuit (0: never opens).
    pub failures: u32,
    /// How long it stays open before requests may probe it (half-open).
    pub open_for: Nanos,
    /// Requests let through at once while half-open (≥ 1).
    pub probes: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: 0,
            open_for: 30 * crate::time::NS_PER_SEC,
            probes: 1,
        }
    }
}

/// One upstream's settings (the decision part; the live driver keeps the
/// URL and credential beside it).
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    /// Its own provider limits (RPM, TPM, QPH, provisioned units…).
    pub limits: Vec<LimitSpec>,
    /// Unanswered requests it may hold at once (None: no cap).
    pub max_in_flight: Option<u64>,
    /// An attempt's deadline: until the reply's head.
    pub timeout: Nanos,
    /// Cooling down after a failure, or after a 429 without a retry hint.
    pub cooldown: Nanos,
    pub breaker: Breaker,
    /// Probe it this often while unhealthy (None: no probes).
    pub probe_every: Option<Nanos>,
}

/// A route's tier: upstreams (indices into [`Config::upstreams`]) and how
/// one is chosen among the open ones ([`Policy::First`] or
/// [`Policy::Weighted`], one weight > 0 per upstream).
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    pub upstreams: Vec<usize>,
    pub policy: Policy,
}

/// A model name → its tiers, tried in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The model the route serves ([`ANY_MODEL`]: every other one).
    pub model: String,
    pub tiers: Vec<Tier>,
    /// Attempts (sends) per request, 1 ..= the route's upstreams.
    pub max_attempts: u32,
}

impl Route {
    /// Every upstream of the route, tier by tier.
    pub fn upstreams(&self) -> impl Iterator<Item = usize> + '_ {
        self.tiers.iter().flat_map(|t| t.upstreams.iter().copied())
    }
}

/// Upstreams and routes.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub upstreams: Vec<Upstream>,
    pub routes: Vec<Route>,
}

/// A config that breaks a structural rule: the field (`route[1].tiers[0]`…,
/// in the core's terms) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub reason: String,
}

impl Config {
    /// Check the rules the gateway relies on: at least one upstream and
    /// one route; names non-empty and used once; every route's upstreams
    /// known, each once, at most [`MAX_ROUTE_UPSTREAMS`]; tiers non-empty
    /// with a policy First or Weighted (one weight > 0 per upstream);
    /// `max_attempts` in 1..=the route's upstreams; timeouts > 0;
    /// `breaker.probes` ≥ 1 and `open_for` > 0 when it can open; a probe
    /// interval > 0.
    pub fn check(&self) -> Result<(), Invalid> {
        let bad = |field: String, reason: String| Err(Invalid { field, reason });
        if self.upstreams.is_empty() {
            return bad("upstream".into(), "at least one upstream is needed".into());
        }
        if self.routes.is_empty() {
            return bad("route".into(), "at least one route is needed".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let f = |x: &str| format!("upstream[{i}].{x}");
            if u.name.trim().is_empty() || !names.insert(u.name.as_str()) {
                return bad(
                    f("name"),
                    format!("must be a non-empty name used once, got {:?}", u.name),
                );
            }
            if u.timeout == 0 {
                return bad(f("timeout"), "must be > 0".into());
            }
            if u.max_in_flight == Some(0) {
                return bad(f("max_in_flight"), "must be > 0".into());
            }
            if u.breaker.probes == 0 {
                return bad(f("breaker.probes"), "must be >= 1".into());
            }
            if u.breaker.failures > 0 && u.breaker.open_for == 0 {
                return bad(f("breaker.open_for"), "must be > 0".into());
            }
            if u.probe_every == Some(0) {
                return bad(f("probe_every"), "must be > 0".into());
            }
            for (k, l) in u.limits.iter().enumerate() {
                if l.limit == 0 || l.window == 0 {
                    return bad(
                        f(&format!("limits[{k}]")),
                        "limit and window must be > 0".into(),
                    );
                }
            }
        }
        let mut models = std::collections::BTreeSet::new();
        for (r, route) in self.routes.iter().enumerate() {
            let f = |x: &str| format!("route[{r}].{x}");
            if route.model.trim().is_empty() || !models.insert(route.model.as_str()) {
                return bad(
                    f("model"),
                    format!("must be a non-empty model used once, got {:?}", route.model),
                );
            }
            if route.tiers.is_empty() {
                return bad(f("tiers"), "at least one tier is needed".into());
            }
            let mut seen = std::collections::BTreeSet::new();
            for (k, t) in route.tiers.iter().enumerate() {
                let ft = |x: &str| f(&format!("tiers[{k}].{x}"));
                if t.upstreams.is_empty() {
                    return bad(ft("upstreams"), "at least one upstream is needed".into());
                }
                for &u in &t.upstreams {
                    if u >= self.upstreams.len() {
                        return bad(ft("upstreams"), format!("no upstream {u}"));
                    }
                    if !seen.insert(u) {
                        return bad(
                            ft("upstreams"),
                            format!(
                                "upstream {:?} is in the route twice",
                                self.upstreams[u].name
                            ),
                        );
                    }
                }
                match &t.policy {
                    Policy::First => {}
                    Policy::Weighted(w) => {
                        if w.len() != t.upstreams.len() {
                            return bad(
                                ft("weights"),
                                format!(
                                    "one weight per upstream: {} weights for {} upstreams",
                                    w.len(),
                                    t.upstreams.len()
                                ),
                            );
                        }
                        if let Some(j) = w.iter().position(|&x| x == 0) {
                            return bad(ft(&format!("weights[{j}]")), "must be > 0".into());
                        }
                    }
                    p => {
                        return bad(
                            ft("policy"),
                            format!("expected first or weighted, got {}", p.name()),
                        )
                    }
                }
            }
            if seen.len() > MAX_ROUTE_UPSTREAMS {
                return bad(
                    f("tiers"),
                    format!(
                        "at most {MAX_ROUTE_UPSTREAMS} upstreams per route, got {}",
                        seen.len()
                    ),
                );
            }
            if route.max_attempts == 0 || route.max_attempts as usize > seen.len() {
                return bad(
                    f("max_attempts"),
                    format!(
                        "must be in 1..={} (the route's upstreams), got {}",
                        seen.len(),
                        route.max_attempts
                    ),
                );
            }
        }
        Ok(())
    }

    /// The route for `model`: the one naming it, else the [`ANY_MODEL`]
    /// route, else none.
    pub fn route_for(&self, model: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.model == model)
            .or_else(|| self.routes.iter().position(|r| r.model == ANY_MODEL))
    }

    /// The index of the upstream named `name`.
    pub fn upstream(&self, name: &str) -> Option<usize> {
        self.upstreams.iter().position(|u| u.name == name)
    }
}

/// What one attempt's reply was, as the gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// 2xx: the answer streams; [`Gateway::finish`] when it ends.
    Ok,
    /// 429, with the retry hint it carried (as a duration).
    RateLimited { hint: Option<Nanos> },
    /// 5xx.
    ServerError,
    /// No reply head by the attempt's deadline.
    Timeout,
    /// No connection, or it closed before any answer.
    Refused,
    /// Another 4xx: the request's own fault (not retried).
    ClientError,
}

impl Reply {
    /// A reply by its HTTP status (`status` 0: refused).
    pub fn from_status(status: u16, hint: Option<Nanos>) -> Reply {
        match status {
            0 => Reply::Refused,
            200..=299 => Reply::Ok,
            429 => Reply::RateLimited { hint },
            400..=499 => Reply::ClientError,
            _ => Reply::ServerError,
        }
    }

    /// A health failure (cooldown, breaker)?
    pub fn is_failure(self) -> bool {
        matches!(self, Reply::ServerError | Reply::Timeout | Reply::Refused)
    }

    /// The name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Reply::Ok => "ok",
            Reply::RateLimited { .. } => "rate_limited",
            Reply::ServerError => "server_error",
            Reply::Timeout => "timeout",
            Reply::Refused => "refused",
            Reply::ClientError => "client_error",
        }
    }
}

/// Why no upstream could take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The upstream opening first is closed by its own limits, its
    /// concurrency cap or a 429's cooldown.
    Limited,
    /// By a failure's cooldown or an open circuit.
    Unavailable,
}

impl Refused {
    pub fn name(self) -> &'static str {
        match self {
            Refused::Limited => "limited",
            Refused::Unavailable => "unavailable",
        }
    }
}

/// What the driver does next with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send it to `upstream`; report the reply, or [`Reply::Timeout`] at
    /// `deadline`.
    Send { upstream: usize, deadline: Nanos },
    /// The reply just reported is the answer (a success, a client error,
    /// or the last allowed attempt's 429 or failure).
    Answer,
    /// No upstream can take it now: refuse it (a 429 for `Limited`, a 503
    /// for `Unavailable`), retrying at `retry_at` at the earliest (None:
    /// when a request ends).
    Refuse {
        why: Refused,
        retry_at: Option<Nanos>,
    },
}

/// One request's progress through its route (small and `Copy`: the
/// driver keeps it with the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    route: u32,
    attempts: u32,
    /// Route positions tried (bit k: the route's k-th upstream, tier by tier).
    tried: u64,
    /// The upstream of the attempt in progress (or of the answer).
    upstream: Option<u32>,
    /// The attempt in progress was let through a half-open circuit.
    probe: bool,
    /// An attempt was sent and has no reply yet.
    pending: bool,
    /// A success whose answer has not yet ended.
    streaming: bool,
    cost: Cost,
}

impl Ticket {
    /// Attempts (sends) so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
    /// The upstream of the attempt in progress or of the answer.
    pub fn upstream(&self) -> Option<usize> {
        self.upstream.map(|u| u as usize)
    }
    pub fn route(&self) -> usize {
        self.route as usize
    }
    /// A success whose answer has not ended yet ([`Gateway::finish`] it).
    pub fn answered(&self) -> bool {
        self.streaming
    }
    pub fn cost(&self) -> Cost {
        self.cost
    }
}

/// A circuit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    Closed,
    /// Open until then; half-open from then on.
    Open {
        until: Nanos,
    },
    /// Half-open: `probes` requests let through and unanswered.
    HalfOpen {
        probes: u32,
    },
}

/// Counts per upstream (for reports and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Attempts sent to it.
    pub sent: u64,
    /// … of which a request's first attempt.
    pub first: u64,
    /// Replies by kind.
    pub ok: u64,
    pub rate_limited: u64,
    pub server_error: u64,
    pub timeout: u64,
    pub refused: u64,
    pub client_error: u64,
    /// Cooldowns started (429 or failure).
    pub cooldowns: u64,
    /// Times its circuit opened.
    pub opened: u64,
    pub probes_ok: u64,
    pub probes_failed: u64,
}

/// One upstream's state.
#[derive(Debug, Clone, PartialEq)]
pub struct UpState {
    limits: RateLimits,
    in_flight: u64,
    cooldown_until: Nanos,
    /// The cooldown in force follows a 429 (else a failure).
    cooled_by_429: bool,
    failures: u32,
    circuit: Circuit,
    /// The next probe (NEVER: none due).
    next_probe: Nanos,
    probing: bool,
    pub counts: Counts,
}

impl UpState {
    fn new(u: &Upstream, now: Nanos) -> UpState {
        UpState {
            limits: RateLimits::new(u.limits.clone(), now),
            in_flight: 0,
            cooldown_until: 0,
            cooled_by_429: false,
            failures: 0,
            circuit: Circuit::Closed,
            next_probe: NEVER,
            probing: false,
            counts: Counts::default(),
        }
    }
    /// Unanswered requests sent to it.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }
    /// Cooling down until then (≤ now: not cooling down).
    pub fn cooldown_until(&self) -> Nanos {
        self.cooldown_until
    }
    /// The circuit as of `now` (an open one past its time is half-open).
    pub fn circuit(&self, now: Nanos) -> Circuit {
        match self.circuit {
            Circuit::Open { until } if now >= until => Circuit::HalfOpen { probes: 0 },
            c => c,
        }
    }
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }
    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }
}

/// The gateway: a config and the state of its upstreams.
#[derive(Debug, Clone)]
pub struct Gateway {
    cfg: Config,
    ups: Vec<UpState>,
    /// One router per route per tier.
    routers: Vec<Vec<Router>>,
}

/// The tier as the router sees it.
struct View<'a> {
    gw: &'a [UpState],
    cfg: &'a Config,
    tier: &'a [usize],
    /// The tier's route positions (for the tried set).
    first_pos: usize,
    tried: u64,
    now: Nanos,
    cost: Cost,
}

impl Targets for View<'_> {
    fn len(&self) -> usize {
        self.tier.len()
    }
    fn open(&self, i: usize) -> bool {
        self.tried & (1u64 << (self.first_pos + i)) == 0
            && open_now(
                &self.cfg.upstreams[self.tier[i]],
                &self.gw[self.tier[i]],
                self.now,
                self.cost,
            )
    }
    fn outstanding(&self, i: usize) -> u64 {
        self.gw[self.tier[i]].in_flight
    }
}

/// Rules 2–5 of "Open".
fn open_now(u: &Upstream, s: &UpState, now: Nanos, cost: Cost) -> bool {
    if now < s.cooldown_until {
        return false;
    }
    let circuit_ok = match s.circuit(now) {
        Circuit::Closed => true,
        Circuit::HalfOpen { probes } => probes < u.breaker.probes,
        Circuit::Open { .. } => false,
    };
    circuit_ok
        && u.max_in_flight.is_none_or(|m| s.in_flight < m)
        && s.limits.check(now, cost).is_ok()
}

/// When a closed upstream opens if nothing else happens, and whether it is
/// closed by a limit (else by a failure): None when that waits on a request
/// ending (concurrency cap, half-open probes) or never comes.
fn opens_at(u: &Upstream, s: &UpState, now: Nanos, cost: Cost) -> (Option<Nanos>, Refused) {
    let mut at = now;
    let mut why = Refused::Limited;
    let mut waits = false;
    if now < s.cooldown_until {
        at = at.max(s.cooldown_until);
        if !s.cooled_by_429 {
            why = Refused::Unavailable;
        }
    }
    match s.circuit(now) {
        Circuit::Closed => {}
        Circuit::Open { until } => {
            at = at.max(until);
            why = Refused::Unavailable;
        }
        Circuit::HalfOpen { probes } => {
            if probes >= u.breaker.probes {
                waits = true;
                why = Refused::Unavailable;
            }
        }
    }
    if u.max_in_flight.is_some_and(|m| s.in_flight >= m) {
        waits = true;
    }
    match s.limits.check(at, cost) {
        Ok(()) => {}
        Err(d) if d.retry_at == NEVER => waits = true,
        Err(d) => at = at.max(d.retry_at),
    }
    (if waits { None } else { Some(at) }, why)
}

impl Gateway {
    /// A gateway in `cfg` (checked: [`Config::check`]) with every upstream
    /// healthy and its buckets full at `now`.
    pub fn new(cfg: Config, now: Nanos) -> Result<Gateway, Invalid> {
        cfg.check()?;
        let ups = cfg.upstreams.iter().map(|u| UpState::new(u, now)).collect();
        let routers = routers(&cfg);
        Ok(Gateway { cfg, ups, routers })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Upstream `u`'s state.
    pub fn upstream(&self, u: usize) -> &UpState {
        &self.ups[u]
    }

    /// Is upstream `u` open (rules 2–5) for a request of `cost` at `now`?
    pub fn is_open(&self, u: usize, now: Nanos, cost: Cost) -> bool {
        open_now(&self.cfg.upstreams[u], &self.ups[u], now, cost)
    }

    /// A request for `route` with `cost` arrives at `now`: its ticket and
    /// the first step ([`Step::Send`] or [`Step::Refuse`]).
    pub fn start<B: Below + ?Sized>(
        &mut self,
        now: Nanos,
        route: usize,
        cost: Cost,
        below: &mut B,
    ) -> (Ticket, Step) {
        let mut t = Ticket {
            route: route as u32,
            attempts: 0,
            tried: 0,
            upstream: None,
            probe: false,
            pending: false,
            streaming: false,
            cost,
        };
        let step = self.next(now, &mut t, below);
        (t, step)
    }

    /// The reply to `t`'s attempt in progress arrived at `now` (or its
    /// deadline passed: [`Reply::Timeout`]); the next step.
    pub fn on_reply<B: Below + ?Sized>(
        &mut self,
        now: Nanos,
        t: &mut Ticket,
        reply: Reply,
        below: &mut B,
    ) -> Step {
        let Some(u) = t.upstream.map(|u| u as usize).filter(|_| t.pending) else {
            // no attempt in progress (a driver's mistake): nothing to do
            return Step::Answer;
        };
        t.pending = false;
        let spec = &self.cfg.upstreams[u];
        let s = &mut self.ups[u];
        let was_probe = std::mem::take(&mut t.probe);
        if was_probe {
            if let Circuit::HalfOpen { probes } = &mut s.circuit {
                *probes = probes.saturating_sub(1);
            }
        }
        let c = &mut s.counts;
        match reply {
            Reply::Ok => c.ok += 1,
            Reply::RateLimited { .. } => c.rate_limited += 1,
            Reply::ServerError => c.server_error += 1,
            Reply::Timeout => c.timeout += 1,
            Reply::Refused => c.refused += 1,
            Reply::ClientError => c.client_error += 1,
        }
        match reply {
            Reply::Ok => {
                s.failures = 0;
                // a success closes a half-open circuit (an open one, not yet
                // past its time, stays open: the request left before it opened)
                if matches!(s.circuit(now), Circuit::HalfOpen { .. }) {
                    s.circuit = Circuit::Closed;
                }
                if s.circuit == Circuit::Closed {
                    s.next_probe = NEVER;
                }
                t.streaming = true;
                return Step::Answer;
            }
            Reply::ClientError => {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.limits.settle(now, t.cost, 0);
                return Step::Answer;
            }
            Reply::RateLimited { hint } => {
                let until = now.saturating_add(hint.unwrap_or(spec.cooldown));
                if until > now {
                    s.counts.cooldowns += 1;
                }
                if until > s.cooldown_until {
                    s.cooldown_until = until;
                    s.cooled_by_429 = true;
                }
            }
            Reply::ServerError | Reply::Timeout | Reply::Refused => {
                fail(spec, s, now);
            }
        }
        s.in_flight = s.in_flight.saturating_sub(1);
        s.limits.settle(now, t.cost, 0);
        if t.attempts >= self.cfg.routes[t.route as usize].max_attempts {
            return Step::Answer;
        }
        self.next(now, t, below)
    }

    /// A successful answer (after [`Reply::Ok`]) ended at `now` with
    /// `output` tokens: settle the upstream's limits, count it answered
    /// (once: a second call does nothing).
    pub fn finish(&mut self, now: Nanos, t: &mut Ticket, output: u64) {
        let Some(u) = t.upstream.map(|u| u as usize) else {
            return;
        };
        if !std::mem::take(&mut t.streaming) {
            return;
        }
        let s = &mut self.ups[u];
        s.in_flight = s.in_flight.saturating_sub(1);
        s.limits.settle(now, t.cost, output);
    }

    /// A request whose attempt is in progress is abandoned at `now`
    /// without a reply (the client left, the driver stopped): its
    /// upstream's count and reservation are released; no health change
    /// (nothing when no attempt is in progress).
    pub fn abandon(&mut self, now: Nanos, t: &mut Ticket) {
        if !std::mem::take(&mut t.pending) {
            return;
        }
        let Some(u) = t.upstream.map(|u| u as usize) else {
            return;
        };
        let s = &mut self.ups[u];
        if std::mem::take(&mut t.probe) {
            if let Circuit::HalfOpen { probes } = &mut s.circuit {
                *probes = probes.saturating_sub(1);
            }
        }
        s.in_flight = s.in_flight.saturating_sub(1);
        s.limits.settle(now, t.cost, 0);
    }

    /// The next time a probe is due (the driver wakes then and asks
    /// [`due_probe`](Self::due_probe)); None when none is.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.ups
            .iter()
            .filter(|s| !s.probing)
            .map(|s| s.next_probe)
            .filter(|&t| t != NEVER)
            .min()
    }

    /// An upstream whose probe is due at `now` (marked as being probed: the
    /// driver reports its result with [`on_probe`](Self::on_probe)); None
    /// when none is.
    pub fn due_probe(&mut self, now: Nanos) -> Option<usize> {
        let u = self
            .ups
            .iter()
            .position(|s| !s.probing && s.next_probe <= now)?;
        self.ups[u].probing = true;
        Some(u)
    }

    /// Upstream `u`'s probe answered at `now`: healthy or not.
    pub fn on_probe(&mut self, now: Nanos, u: usize, ok: bool) {
        let spec = &self.cfg.upstreams[u];
        let s = &mut self.ups[u];
        s.probing = false;
        if ok {
            s.counts.probes_ok += 1;
            s.failures = 0;
            if !s.cooled_by_429 {
                s.cooldown_until = s.cooldown_until.min(now);
            }
            if let Circuit::Open { .. } = s.circuit {
                s.circuit = Circuit::Open { until: now };
            }
            s.next_probe = NEVER;
        } else {
            s.counts.probes_failed += 1;
            fail(spec, s, now);
        }
    }

    /// Put `cfg` (checked) in force at `now`: upstreams found by name keep
    /// their state (their buckets only if their limits are unchanged);
    /// new ones start healthy and full.
    pub fn reconfigure(&mut self, cfg: Config, now: Nanos) -> Result<(), Invalid> {
        cfg.check()?;
        let ups = cfg
            .upstreams
            .iter()
            .map(|u| match self.cfg.upstream(&u.name) {
                Some(o) => {
                    let mut s = self.ups[o].clone();
                    if self.cfg.upstreams[o].limits != u.limits {
                        s.limits = RateLimits::new(u.limits.clone(), now);
                    }
                    if u.probe_every.is_none() {
                        s.next_probe = NEVER;
                    }
                    s
                }
                None => UpState::new(u, now),
            })
            .collect();
        self.routers = routers(&cfg);
        self.ups = ups;
        self.cfg = cfg;
        Ok(())
    }

    /// A ticket of `old` (the config before a reload) in this gateway's
    /// config: its route by model name, its upstreams by name (an upstream
    /// gone: its attempt in progress no longer counts anywhere). None when
    /// the route is gone.
    pub fn translate(&self, old: &Config, t: &Ticket) -> Option<Ticket> {
        let oroute = old.routes.get(t.route as usize)?;
        let route = self
            .cfg
            .routes
            .iter()
            .position(|r| r.model == oroute.model)?;
        let by_name = |u: usize| self.cfg.upstream(&old.upstreams.get(u)?.name);
        let new_pos: Vec<usize> = self.cfg.routes[route].upstreams().collect();
        let mut tried = 0u64;
        for (k, ou) in oroute.upstreams().enumerate() {
            if t.tried & (1 << k) != 0 {
                if let Some(p) = by_name(ou).and_then(|n| new_pos.iter().position(|&x| x == n)) {
                    tried |= 1 << p;
                }
            }
        }
        let upstream = t
            .upstream
            .and_then(|u| by_name(u as usize))
            .map(|u| u as u32);
        Some(Ticket {
            route: route as u32,
            tried,
            upstream,
            probe: t.probe && upstream.is_some(),
            pending: t.pending && upstream.is_some(),
            streaming: t.streaming && upstream.is_some(),
            ..*t
        })
    }

    /// Choose the next upstream for `t` at `now` (or refuse).
    fn next<B: Below + ?Sized>(&mut self, now: Nanos, t: &mut Ticket, below: &mut B) -> Step {
        let r = t.route as usize;
        let route = &self.cfg.routes[r];
        let mut pos = 0usize;
        let mut chosen = None;
        for (k, tier) in route.tiers.iter().enumerate() {
            let view = View {
                gw: &self.ups,
                cfg: &self.cfg,
                tier: &tier.upstreams,
                first_pos: pos,
                tried: t.tried,
                now,
                cost: t.cost,
            };
            if let Some(i) = self.routers[r][k].pick(&view, below) {
                chosen = Some((tier.upstreams[i], pos + i));
                break;
            }
            pos += tier.upstreams.len();
        }
        let Some((u, p)) = chosen else {
            t.upstream = None;
            return self.refusal(now, t);
        };
        let spec = &self.cfg.upstreams[u];
        let s = &mut self.ups[u];
        t.tried |= 1 << p;
        t.attempts += 1;
        t.upstream = Some(u as u32);
        t.pending = true;
        t.streaming = false;
        t.probe = false;
        if let Circuit::HalfOpen { probes } = s.circuit(now) {
            s.circuit = Circuit::HalfOpen { probes: probes + 1 };
            t.probe = true;
        }
        s.in_flight += 1;
        s.limits.commit(now, t.cost);
        s.counts.sent += 1;
        if t.attempts == 1 {
            s.counts.first += 1;
        }
        Step::Send {
            upstream: u,
            deadline: now.saturating_add(spec.timeout),
        }
    }

    /// No untried upstream of `t`'s route is open at `now`: why, and when
    /// the first one opens.
    fn refusal(&self, now: Nanos, t: &Ticket) -> Step {
        let route = &self.cfg.routes[t.route as usize];
        let mut best: Option<(Nanos, Refused)> = None;
        let mut why_any = None;
        for (p, u) in route.upstreams().enumerate() {
            if t.tried & (1 << p) != 0 {
                continue;
            }
            let (at, why) = opens_at(&self.cfg.upstreams[u], &self.ups[u], now, t.cost);
            why_any.get_or_insert(why);
            if let Some(at) = at {
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, why));
                }
            }
        }
        match best {
            Some((at, why)) => Step::Refuse {
                why,
                retry_at: Some(at),
            },
            None => Step::Refuse {
                why: why_any.unwrap_or(Refused::Unavailable),
                retry_at: None,
            },
        }
    }
}

/// A health failure of upstream `s` at `now`.
fn fail(spec: &Upstream, s: &mut UpState, now: Nanos) {
    let until = now.saturating_add(spec.cooldown);
    if until > now {
        s.counts.cooldowns += 1;
    }
    if until >= s.cooldown_until {
        s.cooldown_until = until;
        s.cooled_by_429 = false;
    }
    s.failures = s.failures.saturating_add(1);
    let b = spec.breaker;
    let reopen = matches!(s.circuit(now), Circuit::HalfOpen { .. });
    if reopen || (b.failures > 0 && s.failures >= b.failures && s.circuit == Circuit::Closed) {
        s.circuit = Circuit::Open {
            until: now.saturating_add(b.open_for),
        };
        s.counts.opened += 1;
    }
    if let Some(every) = spec.probe_every {
        if !s.probing {
            s.next_probe = now.saturating_add(every);
        }
    }
}

fn routers(cfg: &Config) -> Vec<Vec<Router>> {
    cfg.routes
        .iter()
        .map(|r| {
            r.tiers
                .iter()
                .map(|t| Router::new(t.policy.clone()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::rates::{Counts as LimCounts, OutputAccounting};
    use crate::time::NS_PER_SEC;

    const S: Nanos = NS_PER_SEC;

    fn up(name: &str, rpm: Option<u64>) -> Upstream {
        Upstream {
            name: name.into(),
            limits: rpm
                .map(|r| LimitSpec {
                    name: "RPM".into(),
                    counts: LimCounts::Requests,
                    limit: r,
                    window: 60 * S,
                    accounting: OutputAccounting::ReserveRefund,
                })
                .into_iter()
                .collect(),
            max_in_flight: None,
            timeout: 10 * S,
            cooldown: 5 * S,
            breaker: Breaker {
                failures: 2,
                open_for: 30 * S,
                probes: 1,
            },
            probe_every: None,
        }
    }

    fn cfg(ups: Vec<Upstream>, policy: Policy, attempts: u32) -> Config {
        let n = ups.len();
        Config {
            upstreams: ups,
            routes: vec![Route {
                model: ANY_MODEL.into(),
                tiers: vec![Tier {
                    upstreams: (0..n).collect(),
                    policy,
                }],
                max_attempts: attempts,
            }],
        }
    }

    fn never(_: u64) -> u64 {
        panic!("no draw expected")
    }

    const C: Cost = Cost {
        input_tokens: 10,
        max_tokens: 10,
    };

    fn sent(s: Step) -> usize {
        match s {
            Step::Send { upstream, .. } => upstream,
            s => panic!("expected a send, got {s:?}"),
        }
    }

    #[test]
    fn spillover_primary_until_its_limit_then_the_next() {
        let mut gw = Gateway::new(
            cfg(vec![up("a", Some(2)), up("b", None)], Policy::First, 2),
            0,
        )
        .unwrap();
        let mut got = vec![];
        for _ in 0..4 {
            let (mut t, s) = gw.start(0, 0, C, &mut never);
            got.push(sent(s));
            assert_eq!(gw.on_reply(0, &mut t, Reply::Ok, &mut never), Step::Answer);
            gw.finish(0, &mut t, 5);
        }
        assert_eq!(got, [0, 0, 1, 1]);
        // 30 s later one request's worth has refilled
        let (_, s) = gw.start(30 * S, 0, C, &mut never);
        assert_eq!(sent(s), 0);
    }

    #[test]
    fn a_429_cools_down_for_its_hint_and_spills_the_request() {
        let mut gw =
            Gateway::new(cfg(vec![up("a", None), up("b", None)], Policy::First, 2), 0).unwrap();
        let (mut t, s) = gw.start(0, 0, C, &mut never);
        assert_eq!(sent(s), 0);
        let s = gw.on_reply(
            S,
            &mut t,
            Reply::RateLimited { hint: Some(2 * S) },
            &mut never,
        );
        assert_eq!(sent(s), 1);
        assert_eq!(t.attempts(), 2);
        assert!(!gw.is_open(0, 3 * S - 1, C));
        assert!(gw.is_open(0, 3 * S, C));
        // not a health failure
        assert_eq!(gw.upstream(0).consecutive_failures(), 0);
        // the second's 429 is the answer: no attempts left
        assert_eq!(
            gw.on_reply(S, &mut t, Reply::RateLimited { hint: None }, &mut never),
            Step::Answer
        );
    }

    #[test]
    fn failures_cool_down_then_open_the_circuit_then_half_open_probes_close_it() {
        let mut gw =
            Gateway::new(cfg(vec![up("a", None), up("b", None)], Policy::First, 2), 0).unwrap();
        let mut now = 0;
        for k in 0..2 {
            let (mut t, s) = gw.start(now, 0, C, &mut never);
            assert_eq!(sent(s), 0, "attempt {k}");
            assert_eq!(
                sent(gw.on_reply(now, &mut t, Reply::Refused, &mut never)),
                1
            );
            assert_eq!(
                gw.on_reply(now, &mut t, Reply::Ok, &mut never),
                Step::Answer
            );
            gw.finish(now, &mut t, 1);
            // cooling down for 5 s
            assert!(!gw.is_open(0, now + 5 * S - 1, C));
            now += 5 * S;
        }
        // the second failure opened the circuit at 5 s for 30 s
        assert_eq!(gw.upstream(0).circuit(now), Circuit::Open { until: 35 * S });
        let (_, s) = gw.start(34 * S, 0, C, &mut never);
        assert_eq!(sent(s), 1);
        // half-open at 35 s: one probe request at a time
        let (mut t, s) = gw.start(35 * S, 0, C, &mut never);
        assert_eq!(sent(s), 0);
        let (_, s) = gw.start(35 * S, 0, C, &mut never);
        assert_eq!(sent(s), 1, "the probe slot is taken");
        assert_eq!(
            gw.on_reply(36 * S, &mut t, Reply::Ok, &mut never),
            Step::Answer
        );
        assert_eq!(gw.upstream(0).circuit(36 * S), Circuit::Closed);
        let (_, s) = gw.start(36 * S, 0, C, &mut never);
        assert_eq!(sent(s), 0);
    }

    #[test]
    fn refusal_names_the_earliest_opening() {
        let mut gw = Gateway::new(
            cfg(vec![up("a", Some(1)), up("b", None)], Policy::First, 2),
            0,
        )
        .unwrap();
        let (mut t, _) = gw.start(0, 0, C, &mut never);
        // a: out of its limit until 60 s; b fails: cooling down until 5 s
        let s = gw.on_reply(0, &mut t, Reply::ServerError, &mut never);
        assert_eq!(sent(s), 1);
        let s = gw.on_reply(0, &mut t, Reply::ServerError, &mut never);
        assert_eq!(s, Step::Answer, "no attempts left");
        let (_, s) = gw.start(S, 0, C, &mut never);
        assert_eq!(
            s,
            Step::Refuse {
                why: Refused::Unavailable,
                retry_at: Some(5 * S)
            }
        );
    }

    #[test]
    fn weighted_draws_only_among_open_upstreams() {
        let mut gw = Gateway::new(
            cfg(
                vec![up("a", None), up("b", Some(1)), up("c", None)],
                Policy::Weighted(vec![1, 2, 3]),
                3,
            ),
            0,
        )
        .unwrap();
        let (_, s) = gw.start(0, 0, C, &mut |n: u64| {
            assert_eq!(n, 6);
            2
        });
        assert_eq!(sent(s), 1);
        // b is now at its limit: draws over a and c (1 + 3)
        let (_, s) = gw.start(0, 0, C, &mut |n: u64| {
            assert_eq!(n, 4);
            1
        });
        assert_eq!(sent(s), 2);
    }

    #[test]
    fn probes_end_a_failure_and_half_open_the_circuit() {
        let mut a = up("a", None);
        a.probe_every = Some(2 * S);
        a.breaker.failures = 1;
        let mut gw = Gateway::new(cfg(vec![a, up("b", None)], Policy::First, 2), 0).unwrap();
        let (mut t, _) = gw.start(0, 0, C, &mut never);
        gw.on_reply(0, &mut t, Reply::Timeout, &mut never);
        assert_eq!(gw.poll_timeout(), Some(2 * S));
        assert_eq!(gw.due_probe(S), None);
        assert_eq!(gw.due_probe(2 * S), Some(0));
        assert_eq!(gw.poll_timeout(), None, "being probed");
        gw.on_probe(2 * S, 0, false);
        assert_eq!(gw.poll_timeout(), Some(4 * S));
        assert_eq!(gw.due_probe(4 * S), Some(0));
        gw.on_probe(4 * S, 0, true);
        assert_eq!(gw.poll_timeout(), None);
        assert_eq!(
            gw.upstream(0).circuit(4 * S),
            Circuit::HalfOpen { probes: 0 }
        );
        let (_, s) = gw.start(4 * S, 0, C, &mut never);
        assert_eq!(sent(s), 0);
    }

    #[test]
    fn fallback_tiers_are_used_only_when_the_first_has_none_open() {
        let mut c = cfg(vec![up("a", Some(1)), up("b", None)], Policy::First, 2);
        c.routes[0].tiers = vec![
            Tier {
                upstreams: vec![0],
                policy: Policy::First,
            },
            Tier {
                upstreams: vec![1],
                policy: Policy::Weighted(vec![5]),
            },
        ];
        let mut gw = Gateway::new(c, 0).unwrap();
        assert_eq!(sent(gw.start(0, 0, C, &mut never).1), 0);
        assert_eq!(sent(gw.start(0, 0, C, &mut never).1), 1);
    }

    #[test]
    fn the_config_check_names_the_field() {
        let c = cfg(vec![up("a", None)], Policy::Weighted(vec![0]), 1);
        assert_eq!(c.check().unwrap_err().field, "route[0].tiers[0].weights[0]");
        let c = cfg(vec![up("a", None)], Policy::First, 2);
        assert_eq!(c.check().unwrap_err().field, "route[0].max_attempts");
        let c = cfg(vec![up("a", None), up("a", None)], Policy::First, 1);
        assert_eq!(c.check().unwrap_err().field, "upstream[1].name");
    }

    #[test]
    fn a_reload_keeps_state_by_name_and_translates_tickets() {
        let mut gw =
            Gateway::new(cfg(vec![up("a", None), up("b", None)], Policy::First, 2), 0).unwrap();
        let (mut t, _) = gw.start(0, 0, C, &mut never);
        let old = gw.config().clone();
        // b first now, a second; c new
        let new = cfg(
            vec![up("c", None), up("b", None), up("a", None)],
            Policy::First,
            3,
        );
        gw.reconfigure(new, S).unwrap();
        assert_eq!(gw.upstream(2).in_flight(), 1);
        let mut t2 = gw.translate(&old, &t).unwrap();
        assert_eq!(t2.upstream(), Some(2));
        let s = gw.on_reply(S, &mut t2, Reply::ServerError, &mut never);
        assert_eq!(sent(s), 0, "c, the first untried");
        assert_eq!(gw.upstream(2).in_flight(), 0);
        assert!(!gw.is_open(2, S, C), "a cools down");
        t = t2;
        assert_eq!(t.attempts(), 2);
    }
}
