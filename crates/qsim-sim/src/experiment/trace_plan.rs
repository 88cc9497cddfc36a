//! Planning server replicas against a trace (`qsim trace plan FILE`): the
//! fewest replicas whose E2E (and TTFT) p95 meets the target in every
//! minute of the trace, the minutes that set that answer, and the same
//! search on synthetic workloads fitted to the trace (gamma gaps of the
//! trace's CV, and Poisson at the same rate and lengths) beside it.
//!
//! A minute is a minute of arrival (`[60 k, 60 (k + 1))` s of the replay);
//! its p95 is over the requests that arrived in it and completed (every
//! run drains: the server finishes every request). Requests the server can
//! never run (longer than the model) are counted, not timed. The search
//! tries 1, 2, 3, … replicas up to a maximum: each try is one simulation
//! of the whole trace with the scenario's router and seed.

use super::server::{run_scenario_observed, Load, Scenario};
use crate::config::ConfigError;
use crate::engine::DurationHist;
use crate::server::ServerProfile;
use crate::time::Nanos;
use crate::trace::stats::{self, Fitted, TraceStats};
use crate::trace::TraceSource;
use crate::workload::OpenLoop;
use crate::workload::{ArrivalProcess, Lengths, RawArrivals};
use std::collections::BTreeMap;
use std::sync::Arc;

const MINUTE: Nanos = 60_000_000_000;

/// The latency targets (seconds), each over every minute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    pub e2e_p95_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
}

/// One minute of arrivals.
#[derive(Debug, Clone, PartialEq)]
pub struct Minute {
    /// Minute index from the start of the replay (0-based).
    pub minute: u64,
    /// Requests that arrived in it.
    pub requests: u64,
    pub e2e_p95_s: f64,
    pub ttft_p95_s: f64,
}

impl Minute {
    fn over(&self, t: &Targets) -> bool {
        t.e2e_p95_s.is_some_and(|x| self.e2e_p95_s > x)
            || t.ttft_p95_s.is_some_and(|x| self.ttft_p95_s > x)
    }
    /// How far over the targets (the larger ratio of p95 to target).
    fn excess(&self, t: &Targets) -> f64 {
        let r = |v: f64, x: Option<f64>| x.map_or(0.0, |x| v / x);
        r(self.e2e_p95_s, t.e2e_p95_s).max(r(self.ttft_p95_s, t.ttft_p95_s))
    }
}

/// A simulation at one replica count.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub replicas: u32,
    /// Minutes with at least one arrival, in order.
    pub minutes: Vec<Minute>,
    /// Requests the server could never run.
    pub rejected: u64,
}

impl Run {
    /// Minutes over a target, the farthest first.
    pub fn over(&self, t: &Targets) -> Vec<Minute> {
        let mut v: Vec<Minute> = self.minutes.iter().filter(|m| m.over(t)).cloned().collect();
        v.sort_by(|a, b| {
            b.excess(t)
                .total_cmp(&a.excess(t))
                .then(a.minute.cmp(&b.minute))
        });
        v
    }
    /// The minute closest to (or farthest over) the targets.
    pub fn worst(&self, t: &Targets) -> Option<&Minute> {
        self.minutes.iter().max_by(|a, b| {
            a.excess(t)
                .total_cmp(&b.excess(t))
                .then(b.minute.cmp(&a.minute))
        })
    }
    pub fn minute(&self, m: u64) -> Option<&Minute> {
        self.minutes.iter().find(|x| x.minute == m)
    }
    /// The minute with the most arrivals (the earliest of equals).
    pub fn busiest(&self) -> Option<&Minute> {
        self.minutes
            .iter()
            .max_by(|a, b| a.requests.cmp(&b.requests).then(b.minute.cmp(&a.minute)))
    }
}

/// Arrivals per minute of `s`'s load as the driver will submit them (the
/// same source, seed and scope): a minute's p95 is final once that many of
/// its requests have completed. Memory: one count per minute with arrivals.
fn arrivals_per_minute(s: &Scenario, seed: u64) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    match &s.load {
        Load::Trace(spec) => {
            if let Ok(mut src) = TraceSource::open(spec, seed, s.index) {
                while let Ok(Some(a)) = src.next() {
                    *m.entry(a.at / MINUTE).or_insert(0) += 1;
                }
            }
        }
        Load::Open { process, .. } => {
            let mut src = OpenLoop::new(
                process.clone(),
                s.lengths.clone(),
                seed,
                s.index,
                0,
                s.duration,
                u64::MAX,
            );
            while let Some((at, _, _)) = src.pop() {
                *m.entry(at / MINUTE).or_insert(0) += 1;
            }
        }
        // no closed loops in a trace plan: every minute kept to the end
        Load::Closed { .. } => {}
    }
    m
}

/// One minute's measurements while its requests complete.
#[derive(Default)]
struct Open {
    requests: u64,
    e2e: DurationHist,
    ttft: DurationHist,
}

impl Open {
    fn minute(&self, minute: u64) -> Minute {
        let p95 = |h: &DurationHist| {
            if h.count() > 0 {
                h.quantile_s(0.95)
            } else {
                0.0
            }
        };
        Minute {
            minute,
            requests: self.requests,
            e2e_p95_s: p95(&self.e2e),
            ttft_p95_s: p95(&self.ttft),
        }
    }
}

/// Simulate `s` with `replicas`, draining, and measure each minute. A
/// minute's histograms live only while its requests are in the server
/// (issue 41: a vector indexed by minute made memory follow the trace's
/// span: 3.5 GB for two rows 1e9 s apart); memory follows the minutes in
/// flight, and one count per minute with arrivals.
pub fn run(profile: &Arc<ServerProfile>, s: &Scenario, replicas: u32, seed: u64) -> Run {
    let mut sc = s.clone();
    sc.replicas = replicas;
    sc.drain = true;
    sc.snapshots.clear();
    let expected = arrivals_per_minute(s, seed);
    let mut open: BTreeMap<u64, Open> = BTreeMap::new();
    let mut minutes: Vec<Minute> = Vec::new();
    let mut rejected = 0;
    run_scenario_observed(profile.clone(), &sc, seed, s.index, None, &mut |c| {
        let m = c.arrival / MINUTE;
        let o = open.entry(m).or_default();
        o.requests += 1;
        if c.rejected {
            rejected += 1;
        } else {
            o.e2e.record(c.finished - c.arrival);
            o.ttft.record(c.first_token - c.arrival);
        }
        if expected.get(&m) == Some(&o.requests) {
            minutes.push(o.minute(m));
            open.remove(&m);
        }
    });
    minutes.extend(open.iter().map(|(&m, o)| o.minute(m)));
    minutes.sort_by_key(|m| m.minute);
    Run {
        replicas,
        minutes,
        rejected,
    }
}

/// What `qsim trace plan` of scenario `s` costs at the least, for the work
/// and memory budget `qsim run` uses ([`crate::budget`]): the statistics'
/// pass over the trace (a row is a quarter of a request), then the search's
/// first run of each of the three workloads (the trace, the fitted gamma,
/// Poisson) at one replica — as `qsim run` of the scenario at one replica
/// costs (its requests and engine iterations; in flight the trace's fluid
/// backlog). The search's later runs are counted by the run-time meter.
pub fn cost(profile: &Arc<ServerProfile>, s: &Scenario) -> crate::budget::Cost {
    use crate::budget::*;
    let mut c = Cost::default();
    let Load::Trace(t) = &s.load else {
        return c;
    };
    let (n, mean_out) = t.expected().unwrap_or((0.0, 0.0));
    let name = format!("scenario {:?}", s.name);
    c.part(&format!("{name}: statistics"), n * 0.25, 0.0);
    let d = crate::time::to_secs(s.duration);
    let its = iterations(profile, 1.0, d, n, mean_out);
    let in_flight = t.summary.as_ref().map_or(n, |sum| {
        super::budget::trace_in_flight(profile, 1.0, sum, t.scale, t.loops).min(n)
    });
    // per-minute histograms of the minutes in flight (two each): at most
    // one minute per request in flight, at most the trace's minutes
    let minutes = t
        .last_arrival()
        .map_or(n, |l| l as f64 / MINUTE as f64 + 1.0)
        .min(in_flight)
        .max(1.0);
    let mem = replicas_bytes(1.0, n, n * mean_out)
        + in_flight * IN_FLIGHT_BYTES
        + 2.0 * hists_bytes(minutes, in_flight);
    for w in ["the trace", "the fitted gamma", "Poisson"] {
        c.part(&format!("{name}: {w} at 1 replica"), n + its, mem);
    }
    c
}

/// The fewest replicas for one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub workload: String,
    /// None: no count up to the maximum meets the targets.
    pub replicas: Option<u32>,
    /// The run at the answer (or at the maximum when none).
    pub run: Run,
    /// The minutes over the targets with one replica fewer (the minutes
    /// that set the answer), the farthest first.
    pub setting: Vec<Minute>,
}

/// The search: 1, 2, … `max` replicas.
pub fn fewest(
    workload: &str,
    profile: &Arc<ServerProfile>,
    s: &Scenario,
    t: &Targets,
    seed: u64,
    max: u32,
) -> Answer {
    let mut prev: Option<Run> = None;
    for r in 1..=max {
        let cur = run(profile, s, r, seed);
        if cur.over(t).is_empty() {
            return Answer {
                workload: workload.into(),
                replicas: Some(r),
                setting: prev.map_or(Vec::new(), |p| p.over(t)),
                run: cur,
            };
        }
        prev = Some(cur);
    }
    let run = prev.expect("max >= 1");
    Answer {
        workload: workload.into(),
        replicas: None,
        setting: run.over(t),
        run,
    }
}

/// A synthetic open-loop scenario with the fitted workload (Poisson gaps
/// when `poisson`), as long as the trace scenario.
pub fn synthetic(s: &Scenario, f: &Fitted, poisson: bool) -> Result<Scenario, String> {
    let arrivals = if poisson {
        RawArrivals::Poisson
    } else {
        f.arrivals.clone()
    };
    let process = ArrivalProcess::new(&arrivals, f.rpm / 60.0)?;
    Ok(Scenario {
        name: format!("{} ({})", s.name, process.kind),
        load: Load::Open {
            rpm: f.rpm,
            process,
        },
        lengths: Lengths {
            input: f.input.validate()?,
            output: f.output.validate()?,
        },
        ..s.clone()
    })
}

/// The trace's plan beside the fitted workloads'.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub scenario: String,
    pub stats: TraceStats,
    pub fitted: Fitted,
    /// The trace's, the fitted gamma's, Poisson's.
    pub answers: Vec<Answer>,
    /// The trace's busiest minute (by arrivals).
    pub busiest: Minute,
    /// The trace at each answer's replica count: its busiest minute.
    pub trace_at: Vec<Option<Minute>>,
}

/// Plan scenario `s` (a trace scenario) and its fitted workloads.
pub fn compare(
    profile: &Arc<ServerProfile>,
    s: &Scenario,
    t: &Targets,
    seed: u64,
    max: u32,
) -> Result<Comparison, ConfigError> {
    let Load::Trace(spec) = &s.load else {
        return Err(ConfigError::new(
            "",
            "",
            format!("scenario {:?} has no trace", s.name),
        ));
    };
    let st = stats::compute(spec, seed)?;
    let fitted = st.fitted().ok_or_else(|| {
        ConfigError::new(
            spec.label(),
            "",
            "fewer than two requests at distinct times: nothing to fit",
        )
    })?;
    let bad = |r: String| ConfigError::new(spec.label(), "", format!("the fitted workload: {r}"));
    let trace = fewest("trace", profile, s, t, seed, max);
    let gamma = fewest(
        &match fitted.arrivals {
            RawArrivals::Gamma { cv } => format!("fitted, gamma CV {cv}"),
            _ => "fitted, constant gaps".into(),
        },
        profile,
        &synthetic(s, &fitted, false).map_err(bad)?,
        t,
        seed,
        max,
    );
    let poisson = fewest(
        "Poisson, same rate and lengths",
        profile,
        &synthetic(s, &fitted, true).map_err(bad)?,
        t,
        seed,
        max,
    );
    let busiest = trace
        .run
        .busiest()
        .cloned()
        .expect("a trace with requests has a minute");
    let answers = vec![trace, gamma, poisson];
    let trace_at = answers
        .iter()
        .map(|a| {
            let r = a.replicas?;
            if Some(r) == answers[0].replicas {
                return answers[0].run.minute(busiest.minute).cloned();
            }
            run(profile, s, r, seed).minute(busiest.minute).cloned()
        })
        .collect();
    Ok(Comparison {
        scenario: s.name.clone(),
        stats: st,
        fitted,
        answers,
        busiest,
        trace_at,
    })
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
