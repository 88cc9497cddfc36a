//! Server experiment files (`kind = "server"`): scenarios of open-loop or
//! closed-loop load against a cluster of server replicas, and the driver that
//! runs them on one event queue.

use super::scaling::RawAutoscale;
use crate::config::{from_value, resolve_relative, ConfigError};
use crate::engine::{DurationHist, EventQueue, RawDist, Sampler, Timed};
use crate::server::{load_profile, Cluster, ClusterMetrics, Request, RouterKind, ServerProfile};
#[cfg(test)]
use crate::time::secs;
use crate::time::{Nanos, NEVER};
use crate::trace::{RawTrace, TraceSource, TraceSpec};
use crate::work::{step_units, Tally, UNITS_PER_REQUEST};
use crate::workload::{
    ArrivalProcess, ClosedLoop, Lengths, OpenLoop, RateShape, RawArrivals, RawShape,
};
use qsim_core::autoscale::Params as AutoscaleParams;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    description: Option<String>,
    rpm: Option<f64>,
    arrivals: Option<RawArrivals>,
    load_shape: Option<RawShape>,
    autoscale: Option<RawAutoscale>,
    clients: Option<i64>,
    /// A request trace replayed instead of drawn arrivals and lengths.
    trace: Option<RawTrace>,
    think_s: Option<RawDist>,
    input_tokens: Option<RawDist>,
    output_tokens: Option<RawDist>,
    duration_s: Option<f64>,
    replicas: Option<i64>,
    router: Option<String>,
    drain: Option<bool>,
    snapshots_s: Option<Vec<f64>>,
    snapshot_every_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerSuite {
    kind: String,
    title: Option<String>,
    description: Option<String>,
    server: String,
    #[serde(default = "one")]
    replicas: i64,
    #[serde(default = "default_router")]
    router: String,
    duration_s: f64,
    #[serde(default)]
    drain: bool,
    #[serde(default)]
    snapshots_s: Vec<f64>,
    snapshot_every_s: Option<f64>,
    arrivals: Option<RawArrivals>,
    load_shape: Option<RawShape>,
    autoscale: Option<RawAutoscale>,
    /// Overrides the profile's `[price]` (`--set price.replica_hour_usd=2.5`).
    price: Option<RawPrice>,
    think_s: Option<RawDist>,
    input_tokens: RawDist,
    output_tokens: RawDist,
    scenario: Vec<RawScenario>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    replica_hour_usd: f64,
}

fn one() -> i64 {
    1
}
fn default_router() -> String {
    "least_outstanding".into()
}

/// Where the load comes from.
#[derive(Debug, Clone)]
pub enum Load {
    /// Open loop at `rpm` requests per minute.
    Open { rpm: f64, process: ArrivalProcess },
    /// `clients` closed-loop clients with think time.
    Closed { clients: u32, think: Sampler },
    /// A request trace: its arrival times and token counts (scanned when
    /// the file was loaded).
    Trace(Arc<TraceSpec>),
}

/// One validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Position in the file: selects the scenario's random streams, so a
    /// scenario gives the same results whichever others run with it.
    pub index: u64,
    pub name: String,
    pub description: String,
    pub load: Load,
    pub lengths: Lengths,
    pub duration: Nanos,
    pub replicas: u32,
    pub router: RouterKind,
    pub drain: bool,
    pub snapshots: Vec<Nanos>,
    /// Replicas between a minimum and a maximum (then `replicas` is the minimum).
    pub autoscale: Option<AutoscaleParams>,
}

/// A validated server suite.
#[derive(Debug, Clone)]
pub struct ServerSuite {
    pub title: String,
    pub description: String,
    pub profile: Arc<ServerProfile>,
    pub profile_path: String,
    pub scenarios: Vec<Scenario>,
}

fn pos_f(file: &str, field: &str, v: f64, max: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 && v <= max {
        Ok(v)
    } else {
        Err(ConfigError::new(
            file,
            field,
            format!("must be in (0, {max}], got {v}"),
        ))
    }
}

/// A positive duration in seconds, at most `max`, checked into nanoseconds.
fn dur(file: &str, field: &str, v: f64, max: f64) -> Result<Nanos, ConfigError> {
    let v = pos_f(file, field, v, max)?;
    crate::time::try_secs_positive(v).map_err(|e| ConfigError::new(file, field, e.to_string()))
}

fn pos_i(file: &str, field: &str, v: i64, max: i64) -> Result<u32, ConfigError> {
    if v > 0 && v <= max {
        Ok(v as u32)
    } else {
        Err(ConfigError::new(
            file,
            field,
            format!("must be in 1..={max}, got {v}"),
        ))
    }
}

fn snapshots(file: &str, field: &str, v: &[f64]) -> Result<Vec<Nanos>, ConfigError> {
    let mut out = Vec::with_capacity(v.len());
    for (i, &s) in v.iter().enumerate() {
        let t = dur(file, &format!("{field}[{i}]"), s, 1e7)?;
        if out.last().is_some_and(|&p| p >= t) {
            return Err(ConfigError::new(
                file,
                format!("{field}[{i}]"),
                "snapshot times must increase",
            ));
        }
        out.push(t);
    }
    Ok(out)
}

impl ServerSuite {
    /// Validate a parsed experiment file.
    pub fn from_value(file: &Path, v: toml::Value) -> Result<Self, ConfigError> {
        let fname = file.display().to_string();
        let f = fname.as_str();
        let raw: RawServerSuite = from_value(f, v)?;
        crate::config::expect_kind(f, &raw.kind, "server", "a server experiment file")?;
        let ppath = resolve_relative(file, &raw.server);
        if let Some(why) = crate::config::source_problem("server profile", &ppath) {
            return Err(ConfigError::new(f, "server", why));
        }
        let mut profile = load_profile(&ppath)?;
        if let Some(p) = &raw.price {
            let v = p.replica_hour_usd;
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(ConfigError::new(
                    f,
                    "price.replica_hour_usd",
                    format!("must be in [0, 1e6] dollars per replica-hour, got {v}"),
                ));
            }
            profile.replica_hour_usd = Some(v);
            profile.price_source = format!("{f}: price.replica_hour_usd");
        }
        let profile = Arc::new(profile);
        let replicas = pos_i(f, "replicas", raw.replicas, 4096)?;
        let router = RouterKind::parse(&raw.router).ok_or_else(|| {
            ConfigError::new(
                f,
                "router",
                format!(
                    "unknown router {:?}; expected round_robin, least_outstanding or least_kv",
                    raw.router
                ),
            )
        })?;
        let duration_ns = dur(f, "duration_s", raw.duration_s, 1e7)?;
        let duration = raw.duration_s;
        let snaps = snapshots(f, "snapshots_s", &raw.snapshots_s)?;
        if raw.scenario.is_empty() {
            return Err(ConfigError::new(
                f,
                "scenario",
                "at least one [[scenario]] is needed",
            ));
        }
        let mut scenarios = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut trace_specs = std::collections::BTreeMap::new();
        for (i, s) in raw.scenario.iter().enumerate() {
            let at = format!("scenario[{i}]");
            let fld = |x: &str| format!("{at}.{x}");
            if s.name.trim().is_empty() {
                return Err(ConfigError::new(f, fld("name"), "must not be empty"));
            }
            let lengths = Lengths {
                input: match &s.input_tokens {
                    Some(d) => d
                        .validate()
                        .map_err(|r| ConfigError::new(f, fld("input_tokens"), r))?,
                    None => raw
                        .input_tokens
                        .validate()
                        .map_err(|r| ConfigError::new(f, "input_tokens", r))?,
                },
                output: match &s.output_tokens {
                    Some(d) => d
                        .validate()
                        .map_err(|r| ConfigError::new(f, fld("output_tokens"), r))?,
                    None => raw
                        .output_tokens
                        .validate()
                        .map_err(|r| ConfigError::new(f, "output_tokens", r))?,
                },
            };
            if let Some(t) = &s.trace {
                if s.rpm.is_some()
                    || s.clients.is_some()
                    || s.arrivals.is_some()
                    || s.think_s.is_some()
                {
                    return Err(ConfigError::new(
                        f,
                        &at,
                        "a trace scenario takes its arrivals from the trace: no `rpm`, `clients`, `arrivals` or `think_s`",
                    ));
                }
                let spec = TraceSpec::from_raw(f, &fld("trace."), file, t, true)?;
                trace_specs.insert(i, Arc::new(spec));
            }
            let load = match (s.rpm, s.clients) {
                _ if trace_specs.contains_key(&i) => Load::Trace(trace_specs[&i].clone()),
                (Some(rpm), None) => {
                    let rpm = pos_f(f, &fld("rpm"), rpm, 1e9)?;
                    let arr = s
                        .arrivals
                        .as_ref()
                        .or(raw.arrivals.as_ref())
                        .cloned()
                        .unwrap_or(RawArrivals::Poisson);
                    let mut process = ArrivalProcess::new(&arr, rpm / 60.0)
                        .map_err(|r| ConfigError::new(f, fld("arrivals"), r))?;
                    let (shape, at) = match &s.load_shape {
                        Some(sh) => (Some(sh), fld("load_shape")),
                        None => (raw.load_shape.as_ref(), "load_shape".to_string()),
                    };
                    if let Some(sh) = shape {
                        let sh = RateShape::new(sh).map_err(|r| ConfigError::new(f, at, r))?;
                        process = process.with_shape(sh);
                    }
                    if s.think_s.is_some() {
                        return Err(ConfigError::new(
                            f,
                            fld("think_s"),
                            "only closed-loop scenarios (`clients`) think",
                        ));
                    }
                    Load::Open { rpm, process }
                }
                (None, Some(c)) => {
                    let clients = pos_i(f, &fld("clients"), c, 10_000_000)?;
                    if s.arrivals.is_some() || s.load_shape.is_some() {
                        return Err(ConfigError::new(
                            f,
                            fld(if s.arrivals.is_some() {
                                "arrivals"
                            } else {
                                "load_shape"
                            }),
                            "closed-loop scenarios have no arrival process",
                        ));
                    }
                    let think = match s.think_s.as_ref().or(raw.think_s.as_ref()) {
                        Some(d) => d
                            .validate()
                            .map_err(|r| ConfigError::new(f, fld("think_s"), r))?,
                        None => Sampler::constant(0.0),
                    };
                    Load::Closed { clients, think }
                }
                (Some(_), Some(_)) => {
                    return Err(ConfigError::new(
                        f,
                        &at,
                        "give either `rpm` (open loop) or `clients` (closed loop), not both",
                    ))
                }
                (None, None) => {
                    return Err(ConfigError::new(
                        f,
                        &at,
                        "needs `rpm` (open loop) or `clients` (closed loop)",
                    ))
                }
            };
            let router = match &s.router {
                None => router,
                Some(r) => RouterKind::parse(r).ok_or_else(|| {
                    ConfigError::new(
                        f,
                        fld("router"),
                        format!("unknown router {r:?}; expected round_robin, least_outstanding or least_kv"),
                    )
                })?,
            };
            if !seen.insert(s.name.as_str()) {
                return Err(ConfigError::new(
                    f,
                    fld("name"),
                    format!("duplicate scenario name {:?}", s.name),
                ));
            }
            scenarios.push(Scenario {
                index: i as u64,
                name: s.name.clone(),
                description: s.description.clone().unwrap_or_default(),
                load,
                lengths,
                duration: match (s.duration_s, trace_specs.get(&i)) {
                    (Some(d), _) => dur(f, &fld("duration_s"), d, 1e7)?,
                    // a trace scenario lasts its trace (to its last arrival)
                    (None, Some(t)) => t.last_arrival().unwrap_or(0) + 1,
                    (None, None) => duration_ns,
                },
                replicas: match s.replicas {
                    Some(r) => pos_i(f, &fld("replicas"), r, 4096)?,
                    None => replicas,
                },
                router,
                autoscale: match (&s.autoscale, &raw.autoscale) {
                    (Some(a), _) => Some(a.validate(f, &fld("autoscale"), &profile)?),
                    (None, Some(a)) => Some(a.validate(f, "autoscale", &profile)?),
                    (None, None) => None,
                },
                drain: s.drain.unwrap_or(raw.drain),
                snapshots: {
                    let mut v = match &s.snapshots_s {
                        Some(v) => snapshots(f, &fld("snapshots_s"), v)?,
                        None => snaps.clone(),
                    };
                    let (every, at) = match s.snapshot_every_s {
                        Some(e) => (Some(e), fld("snapshot_every_s")),
                        None => (raw.snapshot_every_s, "snapshot_every_s".to_string()),
                    };
                    if let Some(e) = every {
                        dur(f, &at, e, 1e7)?;
                        let d = s.duration_s.unwrap_or(duration);
                        if d / e > 100_000.0 {
                            return Err(ConfigError::new(
                                f,
                                at,
                                format!("more than 100,000 snapshots in {d} s"),
                            ));
                        }
                        let mut k = 1.0;
                        while k * e <= d + 1e-9 {
                            // k·e <= d <= 1e7 s: inside the clock's range
                            v.push(
                                crate::time::try_secs(k * e)
                                    .map_err(|r| ConfigError::new(f, &at, r.to_string()))?,
                            );
                            k += 1.0;
                        }
                        v.sort_unstable();
                        v.dedup();
                    }
                    v
                },
            });
        }
        Ok(ServerSuite {
            title: raw.title.unwrap_or_default(),
            description: raw.description.unwrap_or_default(),
            profile,
            profile_path: ppath.display().to_string(),
            scenarios,
        })
    }
}

impl ServerSuite {
    /// Keep only the scenarios named in `names` (all if empty), e.g. for
    /// `--only`; an unknown name is an error listing the file's scenarios.
    pub fn retain_only(&mut self, names: &[String]) -> Result<(), ConfigError> {
        if names.is_empty() {
            return Ok(());
        }
        for n in names {
            if !self.scenarios.iter().any(|s| &s.name == n) {
                let known: Vec<&str> = self.scenarios.iter().map(|s| s.name.as_str()).collect();
                return Err(ConfigError::new(
                    "--only",
                    "",
                    format!("no scenario named {n:?}; the file has {}", known.join(", ")),
                ));
            }
        }
        self.scenarios.retain(|s| names.contains(&s.name));
        Ok(())
    }
}

/// The server's state at a chosen time.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub t: Nanos,
    pub waiting: u64,
    pub running: u64,
    pub outstanding: u64,
    pub completed: u64,
    /// E2E of the requests that finished since the previous snapshot.
    pub e2e_p50_s: f64,
    pub e2e_max_s: f64,
    /// GPU utilization since the previous snapshot (mean over replicas).
    pub gpu_util: f64,
    /// KV blocks in use now / all blocks (all replicas).
    pub kv_util: f64,
    /// Preemptions so far.
    pub preemptions: u64,
}

/// What one scenario measured.
#[derive(Debug, Clone)]
pub struct ServerResult {
    pub name: String,
    /// End of the measurement window (the scenario's duration, or later if drained).
    pub until: Nanos,
    pub metrics: ClusterMetrics,
    pub snapshots: Vec<Snapshot>,
    /// Requests still in the server at `until`.
    pub unfinished: u64,
    /// ∫ replicas holding a GPU dt over [0, until], in replica-nanoseconds
    /// (fixed: replicas × until; autoscaled: starting, ready and draining).
    pub gpu_ns: u128,
    pub replicas_max: u64,
    /// Per minute, for autoscaled or time-varying scenarios (else empty).
    pub minutes: Vec<Minute>,
    /// The replicas' lives (autoscaled scenarios).
    pub scale_log: Vec<crate::server::ScaleEvent>,
    pub autoscaled: bool,
    /// Dollars per replica-hour (the profile's `[price]`), if known.
    pub replica_hour_usd: Option<f64>,
}

/// One minute of an autoscaled or time-varying scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Minute {
    /// Mean replicas holding a GPU (starting, ready, draining) over the minute.
    pub replicas: f64,
    /// Mean replicas ready to serve.
    pub ready: f64,
    /// Requests that arrived in the minute.
    pub arrivals: u64,
    /// p95 TTFT and E2E of the requests that finished in the minute (0 if none).
    pub ttft_p95_s: f64,
    pub e2e_p95_s: f64,
}

/// The server sampled at fixed intervals (`qsim run --plot`): requests
/// waiting and running at each sample, and the median E2E of the requests
/// finished since the previous sample (NaN if none). One entry per sample,
/// so memory is bounded by the number of samples, not of requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub t: Vec<Nanos>,
    pub waiting: Vec<u64>,
    pub running: Vec<u64>,
    pub e2e_p50_s: Vec<f64>,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrival,
    Send(u32),
    Snapshot,
    /// A sample of the series (only when asked for).
    Sample,
    /// The end of a minute (autoscaled or time-varying scenarios).
    Minute,
}

impl Timed for Cluster {
    fn poll_timeout(&self) -> Option<Nanos> {
        Cluster::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Nanos) {
        Cluster::handle_timeout(self, now)
    }
    fn handle_through(&mut self, next: Nanos, limit: Nanos) -> Nanos {
        Cluster::handle_through(self, next, limit)
    }
}

const MINUTE: Nanos = 60_000_000_000;

/// Run every scenario (each on a fresh cluster).
pub fn run_suite(suite: &ServerSuite, seed: u64) -> Vec<ServerResult> {
    suite
        .scenarios
        .iter()
        .map(|s| run_scenario(suite.profile.clone(), s, seed, s.index))
        .collect()
}

/// Run one scenario with `seed`; `scope` separates scenarios' random streams.
pub fn run_scenario(
    profile: Arc<ServerProfile>,
    s: &Scenario,
    seed: u64,
    scope: u64,
) -> ServerResult {
    run_scenario_sampled(profile, s, seed, scope, None).0
}

/// [`run_scenario`], also sampling the server every `every` (from `every`
/// to the scenario's duration) when asked. Sampling only reads the
/// cluster: the result is the same as without it.
pub fn run_scenario_sampled(
    profile: Arc<ServerProfile>,
    s: &Scenario,
    seed: u64,
    scope: u64,
    every: Option<Nanos>,
) -> (ServerResult, Option<Series>) {
    run_scenario_observed(profile, s, seed, scope, every, &mut |_| {})
}

/// [`run_scenario_sampled`], also handing every completion to `observe`
/// as it leaves the server (e.g. latencies per minute of arrival, for
/// planning against a trace); observing does not change the run.
pub fn run_scenario_observed(
    profile: Arc<ServerProfile>,
    s: &Scenario,
    seed: u64,
    scope: u64,
    every: Option<Nanos>,
    observe: &mut dyn FnMut(&crate::server::Completion),
) -> (ServerResult, Option<Series>) {
    run_observed(profile, s, seed, scope, every, observe, true)
}

/// [`run_scenario_observed`]; `lazy`: an open loop's cluster advances its
/// replicas only as routing needs ([`Cluster::advance_lazily`]; off only
/// in tests, as the reference it is compared with).
pub(crate) fn run_observed(
    profile: Arc<ServerProfile>,
    s: &Scenario,
    seed: u64,
    scope: u64,
    every: Option<Nanos>,
    observe: &mut dyn FnMut(&crate::server::Completion),
    lazy: bool,
) -> (ServerResult, Option<Series>) {
    let mut q: EventQueue<Ev> = EventQueue::new();
    let mut cluster = Cluster::new(
        profile,
        s.replicas,
        s.router,
        seed.wrapping_add(scope << 32),
    );
    if let Some(p) = &s.autoscale {
        cluster = cluster.with_autoscaler(p.clone());
    }
    let per_minute = s.autoscale.is_some()
        || matches!(&s.load, Load::Open { process, .. } if process.shape.is_some());
    let mut minutes = Vec::new();
    let (mut min_ttft, mut min_e2e) = (DurationHist::new(), DurationHist::new());
    let (mut min_prev, mut min_gpu, mut min_ready, mut min_arr) = (0, 0u128, 0u128, 0u64);
    if per_minute {
        let mut t = MINUTE;
        while t <= s.duration {
            q.schedule(t, Ev::Minute);
            t += MINUTE;
        }
    }
    let end = s.duration;
    let mut open = None;
    let mut trace = None;
    let mut closed = None;
    let mut next_id = 0u64;
    match &s.load {
        Load::Open { process, .. } => {
            let src = OpenLoop::new(
                process.clone(),
                s.lengths.clone(),
                seed,
                scope,
                0,
                end,
                u64::MAX,
            );
            if let Some(t) = src.peek() {
                q.schedule(t, Ev::Arrival);
            }
            open = Some(src);
        }
        Load::Trace(spec) => {
            let src = TraceSource::open(spec, seed, scope)
                .unwrap_or_else(|e| panic!("the trace changed since it was checked: {e}"));
            if let Some(t) = src.peek() {
                q.schedule(t, Ev::Arrival);
            }
            trace = Some(src);
        }
        Load::Closed { clients, think } => {
            for c in 0..*clients {
                q.schedule(0, Ev::Send(c));
            }
            closed = Some(ClosedLoop::new(
                *clients,
                think.clone(),
                s.lengths.clone(),
                seed,
                scope,
                end,
            ));
        }
    }
    for &t in &s.snapshots {
        q.schedule(t, Ev::Snapshot);
    }
    let mut series = every.map(|_| Series::default());
    let mut sample_window = DurationHist::new();
    if let Some(e) = every.filter(|&e| e > 0) {
        let mut t = e;
        while t <= end {
            q.schedule(t, Ev::Sample);
            t += e;
        }
    }
    // closed loop: request id → client, only while in flight
    let mut owner: std::collections::BTreeMap<u64, u32> = std::collections::BTreeMap::new();
    let mut window = DurationHist::new();
    // the window is read by snapshots only
    let windowed = !s.snapshots.is_empty();
    let mut completed = 0u64;
    let mut snaps = Vec::with_capacity(s.snapshots.len());
    let mut last = 0;
    let (mut prev_t, mut prev_busy): (Nanos, u128) = (0, 0);
    // the run-time work budget: a request sent or an engine iteration is one
    // (plus the replica scan of every step)
    // open loads (a process or a trace): completions feed nothing back, so
    // the cluster's deadlines between two events run in one step (the same
    // run; fewer, larger steps)
    let fuse = closed.is_none();
    if fuse && lazy {
        // nothing but submissions between two of this driver's steps: the
        // replicas need advancing only for the router (or when read, below)
        cluster.advance_lazily();
    }
    let mut tally = Tally::new();
    let scan = step_units(cluster.replica_count());
    let mut steps = 0u64;
    let work = |c: &Cluster, sent: u64, steps: u64| {
        UNITS_PER_REQUEST * (sent + c.iterations()) + scan * steps
    };
    // the engine's event-loop contract: the cluster's deadline first at
    // equal times, then this driver's events FIFO; completions drained after
    // every step
    loop {
        if !tally.at(work(&cluster, next_id, steps)) {
            break;
        }
        steps += 1;
        let draining = s.drain && cluster.outstanding() > 0;
        let go = |t| t <= end || draining;
        let step = if fuse {
            // every deadline of the cluster up to the next event at once;
            // without draining no deadline after `end` runs
            q.step_through(&mut cluster, go, if s.drain { NEVER } else { end })
        } else {
            q.step_while(&mut cluster, go)
        };
        let Some((now, ev)) = step else {
            break;
        };
        if let Some(ev) = ev {
            match ev {
                Ev::Arrival if trace.is_some() => {
                    let src = trace.as_mut().expect("trace");
                    let a = src.pop().expect("peeked arrival");
                    cluster.submit(
                        a.at,
                        Request {
                            id: next_id,
                            input_tokens: a.input,
                            output_tokens: a.output,
                        },
                    );
                    next_id += 1;
                    if let Some(nt) = src.peek() {
                        q.schedule(nt, Ev::Arrival);
                    }
                }
                Ev::Arrival => {
                    let src = open.as_mut().expect("open loop");
                    let (at, i, o) = src.pop().expect("peeked arrival");
                    cluster.submit(
                        at,
                        Request {
                            id: next_id,
                            input_tokens: i,
                            output_tokens: o,
                        },
                    );
                    next_id += 1;
                    if let Some(nt) = src.peek() {
                        q.schedule(nt, Ev::Arrival);
                    }
                }
                Ev::Send(c) => {
                    let cl = closed.as_mut().expect("closed loop");
                    let (i, o) = cl.lengths();
                    owner.insert(next_id, c);
                    cluster.submit(
                        now,
                        Request {
                            id: next_id,
                            input_tokens: i,
                            output_tokens: o,
                        },
                    );
                    next_id += 1;
                }
                Ev::Snapshot => {
                    cluster.settle(now);
                    // the cluster went first at equal times: it is at `now`
                    // and its completions are drained
                    let m = cluster.metrics();
                    let busy: u128 = m.replicas.iter().map(|r| r.gpu_busy_ns).sum();
                    let reps = cluster.replica_count();
                    let dt = (now - prev_t).max(1) as f64 * reps as f64;
                    let used: u64 = (0..reps).map(|i| cluster.kv_blocks_in_use(i) as u64).sum();
                    let total_blocks = cluster.profile().total_blocks as u64 * reps as u64;
                    snaps.push(Snapshot {
                        gpu_util: ((busy - prev_busy) as f64 / dt).min(1.0),
                        kv_util: used as f64 / total_blocks as f64,
                        preemptions: m.replicas.iter().map(|r| r.preemptions).sum(),
                        t: now,
                        waiting: cluster.waiting() as u64,
                        running: cluster.running() as u64,
                        outstanding: cluster.outstanding() as u64,
                        completed,
                        e2e_p50_s: window.quantile_s(0.5),
                        e2e_max_s: window.max_s(),
                    });
                    window = DurationHist::new();
                    prev_t = now;
                    prev_busy = busy;
                }
                Ev::Minute => {
                    cluster.settle(now);
                    let (g, r) = (
                        cluster.gpu_replicas().area(now),
                        cluster.ready_replicas().area(now),
                    );
                    let dt = (now - min_prev).max(1) as f64;
                    minutes.push(Minute {
                        replicas: (g - min_gpu) as f64 / dt,
                        ready: (r - min_ready) as f64 / dt,
                        arrivals: next_id - min_arr,
                        ttft_p95_s: if min_ttft.count() == 0 {
                            0.0
                        } else {
                            min_ttft.quantile_s(0.95)
                        },
                        e2e_p95_s: if min_e2e.count() == 0 {
                            0.0
                        } else {
                            min_e2e.quantile_s(0.95)
                        },
                    });
                    (min_prev, min_gpu, min_ready, min_arr) = (now, g, r, next_id);
                    min_ttft = DurationHist::new();
                    min_e2e = DurationHist::new();
                }
                Ev::Sample => {
                    cluster.settle(now);
                    if let Some(se) = series.as_mut() {
                        se.t.push(now);
                        se.waiting.push(cluster.waiting() as u64);
                        se.running.push(cluster.running() as u64);
                        se.e2e_p50_s.push(if sample_window.count() == 0 {
                            f64::NAN
                        } else {
                            sample_window.quantile_s(0.5)
                        });
                        sample_window = DurationHist::new();
                    }
                }
            }
        }
        last = now;
        while let Some(c) = cluster.poll_completion() {
            observe(&c);
            if !c.rejected {
                completed += 1;
                if windowed {
                    window.record(c.finished - c.arrival);
                }
                if per_minute {
                    min_e2e.record(c.finished - c.arrival);
                    min_ttft.record(c.first_token - c.arrival);
                }
                if series.is_some() {
                    sample_window.record(c.finished - c.arrival);
                }
            }
            if let Some(cl) = closed.as_mut() {
                if let Some(client) = owner.remove(&c.id) {
                    let nt = cl.next_send(c.finished);
                    if nt != NEVER {
                        q.schedule(nt, Ev::Send(client));
                    }
                }
            }
        }
    }
    tally.finish(work(&cluster, next_id, steps));
    let until = if s.drain { last.max(end) } else { end };
    cluster.settle(until);
    let result = ServerResult {
        name: s.name.clone(),
        until,
        metrics: cluster.metrics().clone(),
        snapshots: snaps,
        unfinished: cluster.outstanding() as u64,
        gpu_ns: cluster.gpu_replicas().area(until),
        replicas_max: cluster.gpu_replicas().max,
        minutes,
        scale_log: cluster.scale_log().to_vec(),
        autoscaled: s.autoscale.is_some(),
        replica_hour_usd: cluster.profile().replica_hour_usd,
    };
    (result, series)
}

#[cfg(test)]
#[path = "server_lazy_tests.rs"]
mod lazy_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Arc<ServerProfile> {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-3.1-8b-h100-vllm.toml");
        Arc::new(load_profile(&p).unwrap())
    }

    fn scenario(load: Load, replicas: u32, router: RouterKind) -> Scenario {
        Scenario {
            index: 0,
            name: "t".into(),
            description: String::new(),
            load,
            lengths: Lengths {
                input: Sampler::constant(200.0),
                output: Sampler::constant(100.0),
            },
            duration: secs(120.0),
            replicas,
            router,
            drain: false,
            snapshots: vec![secs(60.0)],
            autoscale: None,
        }
    }

    #[test]
    fn one_closed_loop_client_runs_requests_back_to_back() {
        let s = scenario(
            Load::Closed {
                clients: 1,
                think: Sampler::constant(0.0),
            },
            1,
            RouterKind::RoundRobin,
        );
        let r = run_scenario(profile(), &s, 1, 0);
        let m = &r.metrics.replicas[0];
        // never more than one request in the server; no queueing beyond the API ingress
        assert_eq!(m.running.max, 1);
        assert!((m.queue_delay.max_s() - 0.002).abs() < 1e-9);
        // completions × E2E fill the run (minus the request in flight)
        let busy = m.e2e.sum_s();
        assert!(
            busy <= 120.0 && busy > 120.0 - 2.0 * m.e2e.max_s(),
            "{busy}"
        );
        assert_eq!(r.snapshots.len(), 1);
        assert_eq!(r.snapshots[0].outstanding, 1);
    }

    #[test]
    fn least_outstanding_spreads_load_over_replicas() {
        let process = ArrivalProcess::new(&RawArrivals::Poisson, 20.0).unwrap();
        for router in [
            RouterKind::RoundRobin,
            RouterKind::LeastOutstanding,
            RouterKind::LeastKv,
        ] {
            let s = scenario(
                Load::Open {
                    rpm: 1200.0,
                    process: process.clone(),
                },
                3,
                router,
            );
            let r = run_scenario(profile(), &s, 1, 0);
            let sub: Vec<u64> = r.metrics.replicas.iter().map(|m| m.submitted).collect();
            let total: u64 = sub.iter().sum();
            for x in &sub {
                let share = *x as f64 / total as f64;
                assert!((share - 1.0 / 3.0).abs() < 0.05, "{router:?}: {sub:?}");
            }
        }
    }
}
