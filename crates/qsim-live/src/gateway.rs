//! The proxy's side of the gateway (`qsim_core::gateway`): the core's
//! state behind one mutex (held only for a decision, never across an
//! await), the mapping of an HTTP attempt's outcome to the core's
//! [`Reply`], the weighted draws, the per-upstream metrics and the
//! health-probe task. The handler (`handler.rs`) sends each attempt; the
//! settlement guard (`body.rs`) ends it.
//!
//! [`LiveGateway`] is what the handler drives, and what the acceptance
//! test drives beside the simulation's `hosted::routed::Upstreams` with
//! the same replies to check that both choose the same upstreams.

use crate::config::{Routes, UpstreamHttp};
use crate::metrics::{Metrics, UpstreamLabel, UpstreamResultLabel};
use crate::sync::lock;
use hyper::header::HeaderMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use qsim_core::gateway::{Gateway, Reply, Step, Ticket};
use qsim_core::limiter::rates::Cost;
use qsim_core::route::Below;
use qsim_core::time::Nanos;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What became of one HTTP attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The answer's head arrived with this status and retry hint (already
    /// in the core's time: real × time scale).
    Status { status: u16, hint: Option<Nanos> },
    /// No head by the attempt's deadline.
    Timeout,
    /// No connection, or it closed before any answer.
    Unreachable,
}

impl Outcome {
    /// The answer head's status and retry hint (`retry-after-ms`, then
    /// `retry-after`; in real time, scaled by `time_scale` into the core's).
    pub fn of_head(status: u16, headers: &HeaderMap, time_scale: f64) -> Outcome {
        let hint = if status == 429 || status >= 500 {
            crate::http::retry_hint(headers, None).map(|h| {
                if time_scale == 1.0 {
                    h
                } else {
                    (h as f64 * time_scale) as Nanos
                }
            })
        } else {
            None
        };
        Outcome::Status { status, hint }
    }

    /// As the gateway takes it.
    pub fn reply(self) -> Reply {
        match self {
            Outcome::Status { status, hint } => Reply::from_status(status, hint),
            Outcome::Timeout => Reply::Timeout,
            Outcome::Unreachable => Reply::Refused,
        }
    }
}

/// A request's place in the gateway: its ticket and the routes it was
/// issued under (a reload translates it by names).
#[derive(Debug, Clone)]
pub struct Hold {
    pub ticket: Ticket,
    pub routes: Arc<Routes>,
}

/// The gateway in force, its routes, their names as metric labels and
/// each upstream's metrics (resolved once per routes: a label lookup per
/// request cost ~4 % of the forwarded path's instructions).
pub struct Live {
    pub gw: Gateway,
    pub routes: Arc<Routes>,
    pub names: Vec<Arc<String>>,
    metrics: Vec<UpMetrics>,
}

/// One upstream's metrics (handles sharing the registered families'
/// values).
struct UpMetrics {
    /// By [`Reply`] kind, in [`RESULTS`] order.
    attempts: Vec<Counter>,
    answered: Counter,
    in_flight: Gauge,
    cooldowns: Counter,
    opened: Counter,
}

/// The reply kinds as labelled.
const RESULTS: [&str; 6] = [
    "ok",
    "rate_limited",
    "server_error",
    "timeout",
    "refused",
    "client_error",
];

fn result_index(r: Reply) -> usize {
    match r {
        Reply::Ok => 0,
        Reply::RateLimited { .. } => 1,
        Reply::ServerError => 2,
        Reply::Timeout => 3,
        Reply::Refused => 4,
        Reply::ClientError => 5,
    }
}

fn up_metrics(m: &Metrics, names: &[Arc<String>]) -> Vec<UpMetrics> {
    names
        .iter()
        .map(|n| {
            let label = UpstreamLabel {
                upstream: n.clone(),
            };
            UpMetrics {
                attempts: RESULTS
                    .iter()
                    .map(|&result| {
                        m.upstream_attempts
                            .get_or_create(&UpstreamResultLabel {
                                upstream: n.clone(),
                                result,
                            })
                            .clone()
                    })
                    .collect(),
                answered: m.upstream_answered.get_or_create(&label).clone(),
                in_flight: m.upstream_in_flight.get_or_create(&label).clone(),
                cooldowns: m.upstream_cooldowns.get_or_create(&label).clone(),
                opened: m.upstream_circuit_opened.get_or_create(&label).clone(),
            }
        })
        .collect()
}

fn names(r: &Routes) -> Vec<Arc<String>> {
    r.core
        .upstreams
        .iter()
        .map(|u| Arc::new(u.name.clone()))
        .collect()
}

/// The proxy's gateway: the core's state behind a mutex, and the draws.
pub struct LiveGateway {
    state: Mutex<Live>,
    draws: AtomicU64,
    /// A route names a model (else every request takes the `*` route and
    /// its model need not be read).
    by_model: AtomicBool,
}

fn names_a_model(r: &Routes) -> bool {
    r.core
        .routes
        .iter()
        .any(|x| x.model != qsim_core::gateway::ANY_MODEL)
}

/// SplitMix64: the weighted choices' draws (the proxy needs no seeded
/// stream: only the simulation's runs must repeat).
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl LiveGateway {
    /// The gateway of `routes` at `now` (checked when loaded).
    pub fn new(routes: Routes, now: Nanos, seed: u64) -> Result<LiveGateway, String> {
        let gw = Gateway::new(routes.core.clone(), now)
            .map_err(|e| format!("routes: {}: {}", e.field, e.reason))?;
        let by_model = AtomicBool::new(names_a_model(&routes));
        Ok(LiveGateway {
            by_model,
            state: Mutex::new(Live {
                gw,
                names: names(&routes),
                routes: Arc::new(routes),
                metrics: Vec::new(),
            }),
            draws: AtomicU64::new(seed),
        })
    }

    /// Keep the per-upstream metrics of `m` up to date (the proxy's).
    pub(crate) fn attach(&self, m: &Metrics) {
        let mut l = lock(&self.state);
        l.metrics = up_metrics(m, &l.names);
    }

    /// Does a route name a model (must requests' models be read)?
    pub fn by_model(&self) -> bool {
        self.by_model.load(Ordering::Relaxed)
    }

    /// The routes in force.
    pub fn routes(&self) -> Arc<Routes> {
        lock(&self.state).routes.clone()
    }

    /// Run `f` on the gateway in force (under its lock: no await inside).
    pub fn with<T>(&self, f: impl FnOnce(&mut Live) -> T) -> T {
        f(&mut lock(&self.state))
    }

    /// The proxy's draw in `[0, n)`.
    fn below(&self) -> impl FnMut(u64) -> u64 + '_ {
        move |n: u64| {
            let x = splitmix(self.draws.fetch_add(1, Ordering::Relaxed));
            ((x as u128 * n as u128) >> 64) as u64
        }
    }

    /// A request for `model` of `cost` at `now`: its hold and first step;
    /// None when no route serves the model.
    pub fn start(&self, now: Nanos, model: &str, cost: Cost) -> Option<(Hold, Step)> {
        let mut below = self.below();
        self.start_with(now, model, cost, &mut below)
    }

    /// [`start`](Self::start) with the driver's own draws.
    pub fn start_with<B: Below + ?Sized>(
        &self,
        now: Nanos,
        model: &str,
        cost: Cost,
        below: &mut B,
    ) -> Option<(Hold, Step)> {
        let mut l = lock(&self.state);
        let route = l.routes.core.route_for(model)?;
        let (ticket, step) = l.gw.start(now, route, cost, below);
        Some((
            Hold {
                ticket,
                routes: l.routes.clone(),
            },
            step,
        ))
    }

    /// The attempt of `h` ended in `o` at `now`: the next step, and the
    /// upstream's counts before and after (for the metrics).
    pub fn reply(&self, now: Nanos, h: &mut Hold, o: Outcome) -> Step {
        let mut below = self.below();
        self.reply_with(now, h, o, &mut below)
    }

    /// [`reply`](Self::reply) with the driver's own draws. The upstream's
    /// metrics (attempts by result, cooldowns, circuit openings, in flight,
    /// answered) are updated here.
    pub fn reply_with<B: Below + ?Sized>(
        &self,
        now: Nanos,
        h: &mut Hold,
        o: Outcome,
        below: &mut B,
    ) -> Step {
        let mut l = lock(&self.state);
        if !catch_up(&l, h) {
            return Step::Answer;
        }
        let u = h.ticket.upstream();
        let before = u.map(|u| l.gw.upstream(u).counts);
        let reply = o.reply();
        let step = l.gw.on_reply(now, &mut h.ticket, reply, below);
        if let (Some(u), Some(b)) = (u, before) {
            if let Some(m) = l.metrics.get(u) {
                let s = l.gw.upstream(u);
                let a = s.counts;
                m.attempts[result_index(reply)].inc();
                if a.cooldowns > b.cooldowns {
                    m.cooldowns.inc_by(a.cooldowns - b.cooldowns);
                }
                if a.opened > b.opened {
                    m.opened.inc_by(a.opened - b.opened);
                }
                m.in_flight.set(s.in_flight() as i64);
                if step == Step::Answer {
                    m.answered.inc();
                }
            }
        }
        step
    }

    /// The metric label of upstream `u` in force.
    pub fn name(&self, u: usize) -> Option<Arc<String>> {
        lock(&self.state).names.get(u).cloned()
    }

    /// The answer of `h` (after a 2xx) ended at `now` with `output` tokens;
    /// or, an attempt still in progress, it is abandoned (the client left).
    /// Its upstream's label and unanswered count after.
    pub fn end(&self, now: Nanos, h: &mut Hold, output: u64) {
        let mut l = lock(&self.state);
        if !catch_up(&l, h) {
            return;
        }
        if h.ticket.answered() {
            l.gw.finish(now, &mut h.ticket, output);
        } else {
            // an attempt without a reply: abandoned (nothing if none is in progress)
            l.gw.abandon(now, &mut h.ticket);
        }
        if let Some(u) = h.ticket.upstream() {
            if let Some(m) = l.metrics.get(u) {
                m.in_flight.set(l.gw.upstream(u).in_flight() as i64);
            }
        }
    }

    /// The next probe's time, and a probe due at `now` (its upstream).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        lock(&self.state).gw.poll_timeout()
    }
    pub fn due_probe(&self, now: Nanos) -> Option<(usize, UpstreamHttp)> {
        let mut l = lock(&self.state);
        let u = l.gw.due_probe(now)?;
        Some((u, l.routes.http[u].clone()))
    }
    pub fn on_probe(&self, now: Nanos, u: usize, ok: bool) {
        lock(&self.state).gw.on_probe(now, u, ok)
    }

    /// Put `routes` in force at `now` (a reload): upstreams keep their
    /// state by name.
    pub(crate) fn reconfigure(
        &self,
        routes: Routes,
        now: Nanos,
        m: Option<&Metrics>,
    ) -> Result<(), String> {
        let mut l = lock(&self.state);
        l.gw.reconfigure(routes.core.clone(), now)
            .map_err(|e| format!("routes: {}: {}", e.field, e.reason))?;
        l.names = names(&routes);
        self.by_model
            .store(names_a_model(&routes), Ordering::Relaxed);
        l.routes = Arc::new(routes);
        if let Some(m) = m {
            l.metrics = up_metrics(m, &l.names);
        }
        Ok(())
    }
}

/// Bring `h` to the routes in force (a reload since it was issued): false
/// when its route is gone (the request is then answered as it stands).
fn catch_up(l: &Live, h: &mut Hold) -> bool {
    if Arc::ptr_eq(&l.routes, &h.routes) {
        return true;
    }
    match l.gw.translate(&h.routes.core, &h.ticket) {
        Some(t) => {
            h.ticket = t;
            h.routes = l.routes.clone();
            true
        }
        None => false,
    }
}
