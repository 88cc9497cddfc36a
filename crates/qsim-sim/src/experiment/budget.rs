//! The work budget of an experiment file (see [`crate::budget`]): one seed
//! of a hosted or server suite, or the plan a shared file is.

use super::config::ClientKind;
use super::server::Load as ServerLoad;
use super::{HostedSuite, ServerSuite};
use crate::budget::*;
use crate::config::ConfigError;
use crate::time::to_secs;

/// One seed of a server suite.
pub fn server_suite(suite: &ServerSuite) -> Cost {
    let p = &suite.profile;
    let mut c = Cost::default();
    let mut results = 0.0;
    for s in &suite.scenarios {
        let d = to_secs(s.duration);
        let reps = s.replicas as f64;
        let mean_out = match &s.load {
            ServerLoad::Trace(t) => t.expected().map_or(0.0, |e| e.1),
            _ => mean_tokens(&s.lengths.output),
        };
        // (expected requests, requests for the memory estimate, in flight)
        let (requests, requests_hi, in_flight) = match &s.load {
            ServerLoad::Open { process, .. } => {
                let n = open_requests(process.rate, d, process.cv);
                (process.rate * d, n, n)
            }
            ServerLoad::Trace(t) => {
                // the scan's count; in flight: the fluid backlog of its
                // arrivals against the replicas' full-batch throughput
                let (n, _) = t.expected().unwrap_or((0.0, 0.0));
                let in_flight = t.summary.as_ref().map_or(n, |sum| {
                    trace_in_flight(p, reps, sum, t.scale, t.loops).min(n)
                });
                (n, n, in_flight)
            }
            ServerLoad::Closed { clients, think } => {
                let step = min_step_s(p);
                let cycle = think.mean().max(0.0) + to_secs(p.ingress) + step * mean_out;
                let per_client = d / cycle.max(1e-9);
                let mean_in = mean_tokens(&s.lengths.input);
                let batch = (*clients as f64 / reps).max(1.0);
                let capacity = reps * d / full_batch_cycle_s(p, batch, mean_in, mean_out);
                let n = (*clients as f64 * per_client).min(capacity);
                (n, n, *clients as f64)
            }
        };
        let its = iterations(p, reps, d, requests, mean_out);
        // the live replicas, and their copy in the scenario's result (kept
        // with the earlier scenarios' until the seed is reduced to records)
        let replicas = replicas_bytes(reps, requests_hi, requests_hi * mean_out);
        results += replicas;
        let what = format!("scenario {:?}", s.name);
        c.part(
            &what,
            requests + its,
            replicas + in_flight * IN_FLIGHT_BYTES + results,
        );
        let records = 28.0 * (1.0 + reps) + 1.0 + 10.0 * s.snapshots.len() as f64;
        c.keep(records * RECORD_BYTES);
    }
    c
}

/// The most requests of a trace in a server at once, estimated as a fluid
/// queue: each window of the scan's arrival series ([`RateSeries`]: a
/// minute, or longer for long traces) brings its arrivals (× `scale`), and
/// the replicas serve at their full-batch throughput ([`full_batch_cycle_s`]
/// at `max_num_seqs`); in flight is the backlog plus the window's arrivals
/// plus a full batch per replica. It leans high (a window's arrivals are
/// counted as present at once), never by the trace's length when the
/// replicas keep up (issue 41: the estimate was every request of a 10 M-row
/// trace, 1.5 GB, for a run that peaked at 16 MB). Loops: an overloaded
/// loop leaves its backlog to the next.
///
/// [`RateSeries`]: crate::trace::RateSeries
pub(crate) fn trace_in_flight(
    p: &crate::server::ServerProfile,
    reps: f64,
    sum: &crate::trace::Summary,
    scale: f64,
    loops: u32,
) -> f64 {
    let rows = sum.rows.max(1) as f64;
    let mean_in = (sum.input_total as f64 / rows).max(1.0);
    let mean_out = (sum.output_total as f64 / rows).max(1.0);
    let cycle = full_batch_cycle_s(p, p.max_num_seqs as f64, mean_in, mean_out);
    let served = reps * sum.arrivals.window_s as f64 / cycle.max(1e-12);
    let (mut backlog, mut peak) = (0.0f64, 0.0f64);
    for &a in &sum.arrivals.counts {
        let a = a as f64 * scale;
        peak = peak.max(backlog + a);
        backlog = (backlog + a - served).max(0.0);
    }
    let running = reps * p.max_num_seqs as f64;
    peak + backlog * (loops.max(1) - 1) as f64 + running
}

/// One seed of a hosted-API suite.
pub fn hosted_suite(suite: &HostedSuite) -> Cost {
    let mut c = Cost::default();
    // every experiment's result (one latency histogram, a sample per row)
    // is kept until the seed is reduced to records
    let results: f64 = suite
        .experiments
        .iter()
        .map(|e| hists_bytes(1.0, e.rows as f64) + 1024.0)
        .sum();
    for e in &suite.experiments {
        let slots = match &e.client {
            ClientKind::Pool { workers, .. } => *workers as f64,
            ClientKind::Managed(_) => 0.0,
        };
        let rows = e.rows as f64;
        // every row is tried at least once (retries are counted as they run)
        c.part(
            &format!("experiment {:?}", e.name),
            rows * HOSTED_ATTEMPT_WORK,
            slots * IN_FLIGHT_BYTES + rows.min(1e6) * 16.0 + results,
        );
        c.keep(40.0 * RECORD_BYTES);
    }
    c
}

impl super::ExperimentFile {
    /// The cost of `records(seed, seeds)` (and of `qsim run` of the file).
    pub fn cost(&self, seeds: u64) -> Result<Cost, ConfigError> {
        Ok(match self {
            super::ExperimentFile::Hosted(s) => hosted_suite(s),
            super::ExperimentFile::Server(s) => server_suite(s),
            super::ExperimentFile::Shared(a) => {
                let (f, model) = crate::plan::build(a)?;
                crate::plan::budget::simulate(&f, &model)?
            }
        }
        .times(seeds as f64, "seeds"))
    }
}
