//! Drift: the proxy predicts what the upstream should do for the load it
//! actually forwards, and flags when the upstream stops behaving like its
//! profile (`qsim proxy --profile models/X.toml`).
//!
//! A shadow instance of the profile's sans-IO model (the very [`Backend`]
//! that `qsim serve` drives: the root crate's hosted endpoint or GPU server
//! `Cluster`) is fed every forwarded request — its time of sending on the
//! proxy's clock, its input tokens, its `max_tokens` and, once the answer
//! has ended, the output tokens the upstream actually produced — and its
//! predicted TTFT, inter-token latency, end-to-end latency and 429s are set
//! beside what the upstream did, request by request.
//!
//! **Exact output lengths, a lagging shadow.** A request's output length is
//! known only when its answer ends, but the model needs it when the request
//! arrives. So the shadow runs behind the proxy's clock: it is advanced only
//! up to the earliest sending time of a request still in flight upstream
//! (never past the proxy's `now`), and a finished request is submitted at
//! its own sending time, in sending order. The model thus sees exactly the
//! forwarded load, with the real lengths, in time order; its predictions
//! come late by at most the age of the oldest request in flight.
//!
//! **Off the request path.** The proxy only sends two messages per
//! forwarded request on a channel (`start` when it is sent upstream, `end`
//! when its guard settles it); one thread owns the model, drains the
//! channel, advances the model and publishes the gauges. Nothing is done
//! and nothing is registered when `--profile` is not given.
//!
//! **Estimator.** Per metric, a sliding window of the requests whose
//! prediction ended in the last `window` of model time (default 30 s), with
//! at least `min_samples` pairs (default 20): predicted and observed are
//! the means over the same requests, and the drift ratio is
//! `Σ observed / Σ predicted` (a ratio of means). TTFT and E2E are taken
//! over requests that both the upstream (2xx) and the model answered; ITL
//! = `(E2E − TTFT) / (output − 1)` over those with ≥ 2 output tokens on
//! both sides; upstream 429s are the fractions of requests answered 429
//! (the upstream's 2xx and 429 answers only), with the ratio
//! `(observed 429s + 1) / (predicted 429s + 1)` (counts in the window,
//! +1 so that zero against zero is 1). Transport errors and other statuses
//! are left out of every metric.
//!
//! **Alert.** A ratio outside the band (default [0.67, 1.5]) continuously
//! for `sustain` of model time (default 60 s) sets
//! `qsim_proxy_drift_alert{metric} 1` and logs one warning; a ratio back
//! inside the band sets it to 0 and logs the recovery. A window with too
//! few samples changes nothing.

use crate::clock::Clock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use qsim_core::model::{Backend, Event, Failure, GenRequest};
use qsim_core::time::Nanos;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

/// Makes replica `k` of the shadow model (the root crate: the profile's
/// backend, its seed derived from `k`).
pub type ShadowFactory = Arc<dyn Fn(u64) -> Box<dyn Backend> + Send + Sync>;

/// `--profile` and `[proxy.drift]`, validated.
#[derive(Clone)]
pub struct DriftConfig {
    /// The profile's name (logs).
    pub profile: String,
    pub backend: ShadowFactory,
    /// The drift ratio's band `[low, high]` (0 < low ≤ 1 ≤ high).
    pub band: (f64, f64),
    /// How long (model ns) a ratio must stay outside the band to alert.
    pub sustain: Nanos,
    /// The sliding window of the estimator (model ns).
    pub window: Nanos,
    /// Fewer pairs in the window: no estimate.
    pub min_samples: usize,
    /// Replicas of the model (different seeds) averaged per request.
    pub replicas: usize,
}

impl fmt::Debug for DriftConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriftConfig")
            .field("profile", &self.profile)
            .field("band", &self.band)
            .field("sustain", &self.sustain)
            .field("window", &self.window)
            .field("min_samples", &self.min_samples)
            .field("replicas", &self.replicas)
            .finish()
    }
}

/// What is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Ttft,
    Itl,
    E2e,
    Upstream429,
}

pub const METRICS: [Metric; 4] = [Metric::Ttft, Metric::Itl, Metric::E2e, Metric::Upstream429];

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Itl => "itl",
            Metric::E2e => "e2e",
            Metric::Upstream429 => "upstream_429",
        }
    }
}

/// What the upstream did with one request (durations in model ns from its
/// sending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The HTTP status (0: no answer: unreachable, timed out).
    pub status: u16,
    /// The first body bytes.
    pub ttft: Option<Nanos>,
    /// The end of the answer (or of the exchange).
    pub e2e: Nanos,
    /// Output tokens (the upstream's usage, else the chunks seen).
    pub output: u64,
}

/// The replicas' predictions for one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Pred {
    /// Replicas that answered, refused with a 429, failed otherwise (a 500,
    /// or a request the model cannot run).
    ok: u32,
    limited: u32,
    error: u32,
    /// Sums over the replicas that answered (seconds).
    ttft: f64,
    e2e: f64,
    /// Σ ITL over the answering replicas with ≥ 2 output tokens, and their count.
    itl: f64,
    itl_n: u32,
}

/// One metric's estimate over the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Mean predicted (seconds; for upstream_429 the fraction of requests).
    pub predicted: f64,
    pub observed: f64,
    pub ratio: f64,
    pub samples: usize,
}

#[derive(Debug, Clone, Copy, Default)]
struct Alert {
    /// Outside the band since (model ns).
    since: Option<Nanos>,
    on: bool,
}

/// An alert raised or cleared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    pub metric: Metric,
    pub on: bool,
    pub estimate: Estimate,
    /// Model time of the change.
    pub at: Nanos,
}

struct Running {
    arrival: Nanos,
    /// Per replica: its first token.
    first: Vec<Option<Nanos>>,
    obs: Observed,
    pred: Pred,
    /// Replicas still to finish it.
    left: usize,
}

/// The shadow model (its replicas) and the estimator: sans-IO (every call
/// takes `now`).
pub struct Shadow {
    /// Independent replicas of the model (different seeds), fed the same
    /// requests: their mean prediction is less noisy than one draw.
    backends: Vec<Box<dyn Backend>>,
    band: (f64, f64),
    sustain: Nanos,
    window: Nanos,
    min_samples: usize,
    /// The model's time.
    t: Nanos,
    /// Requests in flight upstream: (sent at, id), and id → sent at.
    open: BTreeSet<(Nanos, u64)>,
    open_at: BTreeMap<u64, Nanos>,
    /// Finished upstream, not yet submitted to the model.
    ready: BTreeMap<(Nanos, u64), (GenRequest, Observed)>,
    /// Submitted, prediction not complete.
    running: BTreeMap<u64, Running>,
    /// (prediction ended at, observed, predicted), in time order.
    samples: VecDeque<(Nanos, Observed, Pred)>,
    /// The window's sums (`estimates` reads them: O(1) per evaluation, not
    /// a scan of the window); kept as samples enter and leave, recomputed
    /// from the window every [`RESUM`] entries (no drift of the float sums).
    sums: Sums,
    entered: u64,
    events: Vec<Event>,
    alerts: [Alert; 4],
}

/// Entries between two exact recomputations of the window's sums.
const RESUM: u64 = 4096;

/// What the window's samples add up to: per metric (TTFT, ITL, E2E)
/// (Σ predicted, Σ observed, n), and for 429s (n, observed, Σ predicted
/// share).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    acc: [(f64, f64, i64); 3],
    n429: i64,
    obs429: i64,
    pred429: f64,
}

impl Sums {
    /// One sample's contribution.
    fn of(o: &Observed, p: &Pred) -> Sums {
        let s = |ns: Nanos| ns as f64 / 1e9;
        let mut c = Sums::default();
        let ok = (200..300).contains(&o.status);
        let decided = p.ok + p.limited;
        if (ok || o.status == 429) && decided > 0 {
            c.n429 = 1;
            c.obs429 = (o.status == 429) as i64;
            c.pred429 = p.limited as f64 / decided as f64;
        }
        let (true, Some(ottft), true) = (ok, o.ttft, p.ok > 0) else {
            return c;
        };
        let ok_n = p.ok as f64;
        c.acc[0] = (p.ttft / ok_n, s(ottft), 1);
        c.acc[2] = (p.e2e / ok_n, s(o.e2e), 1);
        if o.output >= 2 && p.itl_n > 0 {
            c.acc[1] = (
                p.itl / p.itl_n as f64,
                s(o.e2e.saturating_sub(ottft)) / (o.output - 1) as f64,
                1,
            );
        }
        c
    }

    /// Add (`sign` 1) or remove (−1) a contribution.
    fn add(&mut self, c: &Sums, sign: i64) {
        let f = sign as f64;
        for (a, b) in self.acc.iter_mut().zip(c.acc) {
            a.0 += f * b.0;
            a.1 += f * b.1;
            a.2 += sign * b.2;
        }
        self.n429 += sign * c.n429;
        self.obs429 += sign * c.obs429;
        self.pred429 += f * c.pred429;
    }
}

impl Shadow {
    pub fn new(cfg: &DriftConfig) -> Shadow {
        Shadow {
            backends: (0..cfg.replicas.max(1) as u64)
                .map(|k| (cfg.backend)(k))
                .collect(),
            band: cfg.band,
            sustain: cfg.sustain,
            window: cfg.window,
            min_samples: cfg.min_samples.max(1),
            t: 0,
            open: BTreeSet::new(),
            open_at: BTreeMap::new(),
            ready: BTreeMap::new(),
            running: BTreeMap::new(),
            samples: VecDeque::new(),
            sums: Sums::default(),
            entered: 0,
            events: Vec::new(),
            alerts: [Alert::default(); 4],
        }
    }

    /// The model's time (behind the proxy's by the oldest request in flight).
    pub fn time(&self) -> Nanos {
        self.t
    }

    /// Request `id` is sent upstream at `at`. (A message that comes after
    /// the model has passed `at` is taken at the model's time.)
    pub fn start(&mut self, id: u64, at: Nanos) {
        let at = at.max(self.t);
        self.open.insert((at, id));
        self.open_at.insert(id, at);
    }

    /// Request `id`'s answer has ended: what was asked and what happened.
    pub fn end(&mut self, id: u64, req: GenRequest, obs: Observed) {
        if let Some(at) = self.open_at.remove(&id) {
            self.open.remove(&(at, id));
            self.ready.insert((at, id), (req, obs));
        }
    }

    /// Advance the model to `now`, or to the sending time of the oldest
    /// request still in flight if earlier; at equal times the model's own
    /// deadlines run before a submission (the engine's contract).
    pub fn advance(&mut self, now: Nanos) {
        let horizon = self
            .open
            .first()
            .map_or(now, |&(a, _)| a.min(now))
            .max(self.t);
        loop {
            let r = self
                .ready
                .first_key_value()
                .map(|(k, _)| k.0)
                .filter(|&a| a <= horizon);
            // the replica with the earliest deadline (the first at equal times)
            let d = self
                .backends
                .iter()
                .enumerate()
                .filter_map(|(k, b)| b.poll_timeout().map(|d| (d, k)))
                .min()
                .filter(|&(d, _)| d <= horizon);
            let deadline_first = match (d, r) {
                (Some((d, _)), Some(r)) => d <= r,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if let (true, Some((d, k))) = (deadline_first, d) {
                self.t = d.max(self.t);
                self.backends[k].handle_timeout(self.t, &mut self.events);
                self.collect(k);
                continue;
            }
            let Some(((at, id), (req, obs))) = self.ready.pop_first() else {
                break;
            };
            self.t = at.max(self.t);
            let n = self.backends.len();
            self.running.insert(
                id,
                Running {
                    arrival: self.t,
                    first: vec![None; n],
                    obs,
                    pred: Pred::default(),
                    left: n,
                },
            );
            for k in 0..n {
                if self.backends[k]
                    .submit(self.t, id, &req, &mut self.events)
                    .is_err()
                {
                    self.finish(id, |p| p.error += 1);
                }
                self.collect(k);
            }
        }
        self.t = horizon;
        while let Some(&(at, _, _)) = self.samples.front() {
            if at.saturating_add(self.window) >= self.t {
                break;
            }
            if let Some((_, o, p)) = self.samples.pop_front() {
                self.sums.add(&Sums::of(&o, &p), -1);
            }
        }
    }

    /// One replica is done with request `id`: record its outcome; the last
    /// one makes the sample.
    fn finish(&mut self, id: u64, f: impl FnOnce(&mut Pred)) {
        let Some(r) = self.running.get_mut(&id) else {
            return;
        };
        f(&mut r.pred);
        r.left -= 1;
        if r.left == 0 {
            let r = self.running.remove(&id).expect("present");
            self.sums.add(&Sums::of(&r.obs, &r.pred), 1);
            self.samples.push_back((self.t, r.obs, r.pred));
            self.entered += 1;
            if self.entered.is_multiple_of(RESUM) {
                self.sums = Sums::default();
                for (_, o, p) in &self.samples {
                    self.sums.add(&Sums::of(o, p), 1);
                }
            }
        }
    }

    /// Replica `k`'s events at time `self.t`.
    fn collect(&mut self, k: usize) {
        let t = self.t;
        let mut events = std::mem::take(&mut self.events);
        for e in events.drain(..) {
            match e {
                Event::Tokens { id, .. } => {
                    if let Some(r) = self.running.get_mut(&id) {
                        r.first[k].get_or_insert(t);
                    }
                }
                Event::Done {
                    id,
                    completion_tokens: n,
                    ..
                } => {
                    let Some(r) = self.running.get(&id) else {
                        continue;
                    };
                    let e2e = t - r.arrival;
                    let ttft = r.first[k].map_or(e2e, |f| f - r.arrival);
                    let s = |ns: Nanos| ns as f64 / 1e9;
                    self.finish(id, |p| {
                        p.ok += 1;
                        p.ttft += s(ttft);
                        p.e2e += s(e2e);
                        if n >= 2 {
                            p.itl += s(e2e - ttft) / (n - 1) as f64;
                            p.itl_n += 1;
                        }
                    });
                }
                Event::Failed { id, failure } => match failure {
                    Failure::RateLimited { .. } => self.finish(id, |p| p.limited += 1),
                    Failure::ServerError => self.finish(id, |p| p.error += 1),
                },
            }
        }
        self.events = events;
    }

    /// The estimates over the window (`None`: fewer than `min_samples`).
    pub fn estimates(&self) -> [Option<Estimate>; 4] {
        let Sums {
            acc,
            n429,
            obs429,
            pred429,
        } = self.sums;
        let (n429, obs429) = (n429 as usize, obs429 as usize);
        let acc = acc.map(|(p, o, n)| (p, o, n as usize));
        let mean = |(p, o, n): (f64, f64, usize)| {
            (n >= self.min_samples && p > 0.0).then(|| Estimate {
                predicted: p / n as f64,
                observed: o / n as f64,
                ratio: o / p,
                samples: n,
            })
        };
        let r429 = (n429 >= self.min_samples).then(|| Estimate {
            predicted: pred429 / n429 as f64,
            observed: obs429 as f64 / n429 as f64,
            ratio: (obs429 as f64 + 1.0) / (pred429 + 1.0),
            samples: n429,
        });
        [mean(acc[0]), mean(acc[1]), mean(acc[2]), r429]
    }

    /// Update the alerts at the model's time from the estimates; returns
    /// them with the alerts raised or cleared by this call. Outside the
    /// band: the clock runs (alert after `sustain`); inside the inner band
    /// (halfway between 1 and each edge): clock reset, alert cleared; in
    /// between: no change (hysteresis: noise around an edge neither restarts
    /// the clock nor makes the alert flap).
    pub fn evaluate(&mut self) -> ([Option<Estimate>; 4], Vec<Transition>) {
        let est = self.estimates();
        let (lo, hi) = self.band;
        let inner = (1.0 - (1.0 - lo) / 2.0, 1.0 + (hi - 1.0) / 2.0);
        let mut changed = Vec::new();
        for (i, m) in METRICS.iter().enumerate() {
            let Some(e) = est[i] else { continue };
            let a = &mut self.alerts[i];
            if e.ratio < lo || e.ratio > hi {
                let since = *a.since.get_or_insert(self.t);
                if !a.on && self.t - since >= self.sustain {
                    a.on = true;
                    changed.push(Transition {
                        metric: *m,
                        on: true,
                        estimate: e,
                        at: self.t,
                    });
                }
            } else if e.ratio >= inner.0 && e.ratio <= inner.1 {
                a.since = None;
                if a.on {
                    a.on = false;
                    changed.push(Transition {
                        metric: *m,
                        on: false,
                        estimate: e,
                        at: self.t,
                    });
                }
            }
        }
        (est, changed)
    }

    /// Whether each metric's alert is raised.
    pub fn alerts(&self) -> [bool; 4] {
        self.alerts.map(|a| a.on)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MetricLabel {
    pub metric: &'static str,
}

type FGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Default)]
struct Gauges {
    predicted: Family<MetricLabel, FGauge>,
    observed: Family<MetricLabel, FGauge>,
    ratio: Family<MetricLabel, FGauge>,
    samples: Family<MetricLabel, Gauge>,
    alert: Family<MetricLabel, Gauge>,
    lag: FGauge,
}

impl Gauges {
    fn register(&self, r: &mut Registry) {
        r.register(
            "drift_predicted",
            "The profile's prediction for the forwarded load, mean over the drift window (ttft, itl, e2e: seconds; upstream_429: fraction of requests)",
            self.predicted.clone(),
        );
        r.register(
            "drift_observed",
            "What the upstream did for the same requests, mean over the drift window (units as drift_predicted)",
            self.observed.clone(),
        );
        r.register(
            "drift_ratio",
            "observed / predicted over the drift window (upstream_429: (observed 429s + 1) / (predicted 429s + 1))",
            self.ratio.clone(),
        );
        r.register(
            "drift_samples",
            "Requests in the drift window that the metric is estimated from",
            self.samples.clone(),
        );
        r.register(
            "drift_alert",
            "1 while the drift ratio has stayed outside the configured band for the configured time",
            self.alert.clone(),
        );
        r.register(
            "drift_lag_seconds",
            "How far the shadow model runs behind the proxy's clock (the oldest request in flight), model seconds",
            self.lag.clone(),
        );
        for m in METRICS {
            let _ = self.alert.get_or_create(&MetricLabel { metric: m.name() });
        }
    }
}

enum Msg {
    Start(u64, Nanos),
    End(u64, GenRequest, Observed),
}

/// The proxy's handle: a channel to the thread that owns the [`Shadow`].
pub struct Drift {
    tx: Sender<Msg>,
}

/// What a forwarded request carries for drift (in its `Settle` guard).
#[derive(Debug, Clone, Copy)]
pub struct Track {
    pub req: GenRequest,
    pub sent: Nanos,
    pub first: Option<Nanos>,
    pub status: u16,
}

impl Drift {
    /// Register the gauges and start the thread that owns the model.
    pub fn start(cfg: DriftConfig, clock: Clock, registry: &mut Registry) -> Result<Drift, String> {
        let gauges = Gauges::default();
        gauges.register(registry);
        let (tx, rx) = channel();
        let shadow = Shadow::new(&cfg);
        let profile = cfg.profile.clone();
        std::thread::Builder::new()
            .name("qsim-drift".into())
            .spawn(move || run(shadow, rx, clock, gauges, profile))
            .map_err(|e| format!("drift thread: {e}"))?;
        tracing::info!(profile = %cfg.profile, band_low = cfg.band.0, band_high = cfg.band.1,
            sustain_s = cfg.sustain as f64 / 1e9, window_s = cfg.window as f64 / 1e9,
            "drift: predicting the upstream from its profile");
        Ok(Drift { tx })
    }

    /// The request is sent upstream now.
    pub fn start_request(&self, id: u64, now: Nanos, req: GenRequest) -> Track {
        let _ = self.tx.send(Msg::Start(id, now));
        Track {
            req,
            sent: now,
            first: None,
            status: 0,
        }
    }

    /// Its answer has ended at `now` with `output` tokens.
    pub fn end_request(&self, id: u64, t: &Track, now: Nanos, output: u64) {
        let obs = Observed {
            status: t.status,
            ttft: t.first.map(|f| f.saturating_sub(t.sent)),
            e2e: now.saturating_sub(t.sent),
            output,
        };
        let req = GenRequest {
            output_tokens: (200..300).contains(&t.status).then_some(output),
            ..t.req
        };
        let _ = self.tx.send(Msg::End(id, req, obs));
    }
}

/// The thread drains its messages every POLL: it sleeps rather than waits
/// on the channel, so a send on the request path never wakes it (a wake per
/// message cost a futex call there and a context switch per request: ~150 µs
/// of CPU per request at 1,000 req/s, measured).
const POLL: Duration = Duration::from_millis(5);
/// The gauges are published every this many polls (20 ms).
const POLLS_PER_PUBLISH: u32 = 4;

fn run(mut s: Shadow, rx: Receiver<Msg>, clock: Clock, g: Gauges, profile: String) {
    let mut polls: u32 = 0;
    loop {
        std::thread::sleep(POLL);
        loop {
            match rx.try_recv() {
                Ok(m) => apply(&mut s, m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let now = clock.now();
        s.advance(now);
        polls = polls.wrapping_add(1);
        if !polls.is_multiple_of(POLLS_PER_PUBLISH) {
            continue;
        }
        let (est, changed) = s.evaluate();
        for (i, m) in METRICS.iter().enumerate() {
            let l = MetricLabel { metric: m.name() };
            if let Some(e) = est[i] {
                g.predicted.get_or_create(&l).set(e.predicted);
                g.observed.get_or_create(&l).set(e.observed);
                g.ratio.get_or_create(&l).set(e.ratio);
                g.samples.get_or_create(&l).set(e.samples as i64);
            } else {
                g.samples.get_or_create(&l).set(0);
            }
            g.alert.get_or_create(&l).set(s.alerts()[i] as i64);
        }
        g.lag.set(now.saturating_sub(s.time()) as f64 / 1e9);
        for c in changed {
            let e = c.estimate;
            if c.on {
                tracing::warn!(metric = c.metric.name(), %profile, ratio = e.ratio,
                    predicted = e.predicted, observed = e.observed, samples = e.samples,
                    model_time_s = c.at as f64 / 1e9,
                    "drift: the upstream no longer behaves like its profile");
            } else {
                tracing::info!(metric = c.metric.name(), %profile, ratio = e.ratio,
                    predicted = e.predicted, observed = e.observed, samples = e.samples,
                    model_time_s = c.at as f64 / 1e9,
                    "drift: back within the band");
            }
        }
    }
}

fn apply(s: &mut Shadow, m: Msg) {
    match m {
        Msg::Start(id, at) => s.start(id, at),
        Msg::End(id, req, obs) => s.end(id, req, obs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy model: every request answers after `ttft` then `tpot` per
    /// output token; requests above `limit` in flight get a 429 at once.
    struct Toy {
        ttft: Nanos,
        tpot: Nanos,
        limit: usize,
        due: BTreeMap<(Nanos, u64), Event>,
        inflight: usize,
    }

    impl Backend for Toy {
        fn name(&self) -> &str {
            "toy"
        }
        fn submit(
            &mut self,
            now: Nanos,
            id: u64,
            req: &GenRequest,
            _out: &mut Vec<Event>,
        ) -> Result<(), qsim_core::model::Invalid> {
            if self.inflight >= self.limit {
                let failure = Failure::RateLimited {
                    limit: "c".into(),
                    hint: qsim_core::model::RetryHint::None,
                    body: None,
                };
                self.due.insert((now, id), Event::Failed { id, failure });
                return Ok(());
            }
            self.inflight += 1;
            let n = req.output_tokens.or(req.max_tokens).unwrap_or(10);
            self.due
                .insert((now + self.ttft, id), Event::Tokens { id, n: 1 });
            let done = Event::Done {
                id,
                prompt_tokens: req.input_tokens,
                completion_tokens: n,
                finish: qsim_core::model::Finish::Stop,
            };
            self.due
                .insert((now + self.ttft + (n - 1) * self.tpot, id), done);
            Ok(())
        }
        fn poll_timeout(&self) -> Option<Nanos> {
            self.due.first_key_value().map(|(k, _)| k.0)
        }
        fn handle_timeout(&mut self, now: Nanos, out: &mut Vec<Event>) {
            while let Some(e) = self.due.first_entry() {
                if e.key().0 > now {
                    break;
                }
                let e = e.remove();
                if matches!(e, Event::Done { .. }) {
                    self.inflight -= 1;
                }
                out.push(e);
            }
        }
    }

    const S: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;

    fn cfg() -> DriftConfig {
        DriftConfig {
            profile: "toy".into(),
            backend: Arc::new(|_| {
                Box::new(Toy {
                    ttft: 500 * MS,
                    tpot: 10 * MS,
                    limit: 1000,
                    due: BTreeMap::new(),
                    inflight: 0,
                })
            }),
            band: (0.67, 1.5),
            sustain: 60 * S,
            window: 60 * S,
            min_samples: 20,
            replicas: 2,
        }
    }

    fn req() -> GenRequest {
        GenRequest {
            input_tokens: 50,
            max_tokens: Some(100),
            prompt_hash: 0,
            output_tokens: None,
        }
    }

    /// One request every 250 ms for `secs`, the upstream answering like the
    /// toy model × `slow(t)`; the shadow advanced at every arrival and end.
    /// Returns the model time at which each alert was first raised.
    fn run(secs: u64, window: Nanos, slow: impl Fn(Nanos) -> f64) -> (Shadow, [Option<Nanos>; 4]) {
        let c = DriftConfig { window, ..cfg() };
        let mut s = Shadow::new(&c);
        let mut raised = [None; 4];
        // (end time, id, sent, observed)
        let mut ends: BTreeMap<(Nanos, u64), (GenRequest, Observed)> = BTreeMap::new();
        let gap = 250 * MS;
        let mut id = 0;
        let mut t = 0;
        while t < secs * S || !ends.is_empty() {
            let next_end = ends.first_key_value().map(|(k, _)| k.0);
            if t < secs * S && next_end.is_none_or(|e| t <= e) {
                let f = slow(t);
                let n = 20 + id % 50;
                let ttft = (500.0 * f) as Nanos * MS;
                let e2e = ttft + (10.0 * f) as Nanos * MS * (n - 1);
                s.start(id, t);
                let obs = Observed {
                    status: 200,
                    ttft: Some(ttft),
                    e2e,
                    output: n,
                };
                let r = GenRequest {
                    output_tokens: Some(n),
                    ..req()
                };
                ends.insert((t + e2e, id), (r, obs));
                s.advance(t);
                id += 1;
                t += gap;
            } else {
                let ((e, i), (r, o)) = ends.pop_first().unwrap();
                s.end(i, r, o);
                s.advance(e);
            }
            s.evaluate();
            for (k, on) in s.alerts().iter().enumerate() {
                if *on && raised[k].is_none() {
                    raised[k] = Some(s.time());
                }
            }
        }
        (s, raised)
    }

    #[test]
    fn an_upstream_like_its_profile_raises_nothing() {
        let (s, raised) = run(300, 60 * S, |_| 1.0);
        assert_eq!(raised, [None; 4]);
        let e = s.estimates();
        for m in [0, 1, 2] {
            let e = e[m].unwrap();
            assert!((e.ratio - 1.0).abs() < 1e-9, "{e:?}");
            assert!(e.samples >= 200, "{e:?}");
        }
        assert_eq!(e[3].unwrap().ratio, 1.0);
        assert!((e[0].unwrap().predicted - 0.5).abs() < 1e-9);
    }

    /// The window's running sums equal a sum over the window after many
    /// samples have entered and left it.
    #[test]
    fn the_window_sums_follow_the_window() {
        let (s, _) = run(300, 10 * S, |t| if t < 150 * S { 1.0 } else { 1.7 });
        assert!(
            s.entered > 1000 && s.samples.len() < 100,
            "{}",
            s.samples.len()
        );
        let mut r = Sums::default();
        for (_, o, p) in &s.samples {
            r.add(&Sums::of(o, p), 1);
        }
        assert_eq!((s.sums.n429, s.sums.obs429), (r.n429, r.obs429));
        assert!(r.n429 > 0 && r.acc[1].2 > 0);
        for (a, b) in s.sums.acc.iter().zip(r.acc) {
            assert_eq!(a.2, b.2);
            assert!(
                (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9,
                "{a:?} {b:?}"
            );
        }
    }

    /// Latency ×2 from 120 s: TTFT, ITL and E2E alerts after the window
    /// has half turned over (ratio 1.5) plus the sustain time, not before;
    /// no 429 alert.
    #[test]
    fn a_doubled_latency_is_flagged_after_the_sustain_time() {
        let (s, raised) = run(300, 60 * S, |t| if t < 120 * S { 1.0 } else { 2.0 });
        for (k, r) in raised.iter().enumerate().take(3) {
            let r = r.unwrap_or_else(|| panic!("metric {k} not flagged"));
            assert!(r >= 120 * S + 60 * S, "metric {k} at {r}");
            assert!(r <= 120 * S + 120 * S, "metric {k} at {r}");
        }
        assert_eq!(raised[3], None);
        let e = s.estimates()[0].unwrap();
        assert!((e.ratio - 2.0).abs() < 0.01, "{e:?}");
    }

    /// A slowdown shorter than the sustain time raises nothing; an alert
    /// clears when the upstream recovers.
    #[test]
    fn short_blips_pass_and_alerts_clear() {
        // a 10 s window, ×3 for 30 s: outside the band for ~36 s
        let (_, raised) = run(300, 10 * S, |t| {
            if (100 * S..130 * S).contains(&t) {
                3.0
            } else {
                1.0
            }
        });
        assert_eq!(raised, [None; 4]);
        let (s, raised) = run(400, 60 * S, |t| {
            if (60..200).contains(&(t / S)) {
                2.0
            } else {
                1.0
            }
        });
        assert!(raised[0].is_some());
        assert_eq!(s.alerts(), [false; 4], "cleared after recovery");
    }

    /// The shadow never runs past a request still in flight: a request sent
    /// at 1 s and ending at 50 s holds it at 1 s; its prediction uses the
    /// actual output length.
    #[test]
    fn the_shadow_waits_for_requests_in_flight() {
        let c = cfg();
        let mut s = Shadow::new(&c);
        s.start(7, S);
        s.advance(50 * S);
        assert_eq!(s.time(), S);
        let obs = Observed {
            status: 200,
            ttft: Some(500 * MS),
            e2e: 500 * MS + 99 * 10 * MS,
            output: 100,
        };
        s.end(
            7,
            GenRequest {
                output_tokens: Some(100),
                ..req()
            },
            obs,
        );
        s.advance(50 * S);
        assert_eq!(s.time(), 50 * S);
        assert_eq!(s.samples.len(), 1);
        let p = s.samples[0].2;
        assert_eq!((p.ok, p.limited, p.error, p.itl_n), (2, 0, 0, 2));
        assert!((p.ttft - 2.0 * 0.5).abs() < 1e-9, "{p:?}");
        assert!((p.e2e - 2.0 * 1.49).abs() < 1e-9, "{p:?}");
        assert!((p.itl - 2.0 * 0.01).abs() < 1e-9, "{p:?}");
    }

    /// Upstream 429s the model does not predict are flagged.
    #[test]
    fn unpredicted_429s_are_flagged() {
        let c = cfg();
        let mut s = Shadow::new(&c);
        let mut raised = None;
        for i in 0..1000u64 {
            let t = i * 250 * MS;
            s.start(i, t);
            let status = if i >= 400 && i % 4 == 0 { 429 } else { 200 };
            let obs = Observed {
                status,
                ttft: (status == 200).then_some(500 * MS),
                e2e: if status == 200 { 1490 * MS } else { 10 * MS },
                output: if status == 200 { 100 } else { 0 },
            };
            let r = GenRequest {
                output_tokens: (status == 200).then_some(100),
                ..req()
            };
            s.end(i, r, obs);
            s.advance(t);
            s.evaluate();
            if s.alerts()[3] && raised.is_none() {
                raised = Some(s.time());
            }
        }
        let r = raised.expect("flagged");
        assert!((160 * S..=200 * S).contains(&r), "{r}");
        assert!(!s.alerts()[0], "latencies unchanged");
    }
}
