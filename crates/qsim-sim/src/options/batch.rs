//! One batch of rows against a cluster of server replicas (fixed or
//! autoscaled): `workers` callers, each taking the next row when its
//! previous one finished (the hosted experiments' closed pool, without
//! retries: a server replica never answers 429), until every row is done.
//!
//! Rows are drawn exactly as the hosted drivers draw them (the workload
//! stream of the seed, input then natural output length per row, output
//! capped at `max_tokens`), so row `i` is the same prompt and answer length
//! against every option.

use crate::engine::rng::{component, stream};
use crate::engine::{DurationHist, Sampler};
use crate::server::{Cluster, Request, RouterKind, ServerProfile};
use crate::time::Nanos;
use crate::work::{step_units, Tally, UNITS_PER_REQUEST};
use qsim_core::autoscale::Params as AutoscaleParams;
use std::sync::Arc;

/// The batch: rows, their lengths and the callers.
#[derive(Debug, Clone)]
pub struct Batch {
    pub rows: u64,
    pub max_tokens: u64,
    pub workers: u32,
    pub input_tokens: Sampler,
    pub output_tokens: Sampler,
}

/// What one batch run measured.
#[derive(Debug, Clone)]
pub struct BatchResult {
    /// From the first send to the last row's end.
    pub elapsed: Nanos,
    pub ok: u64,
    /// Rows the server could not run (e.g. longer than its context).
    pub failed: u64,
    pub ttft: DurationHist,
    pub e2e: DurationHist,
    /// ∫ replicas holding a GPU dt over [0, elapsed], replica-nanoseconds.
    pub gpu_ns: u128,
    pub replicas_max: u64,
    pub output_tokens: u64,
    /// The run stopped at the work budget (results partial).
    pub stopped: bool,
}

/// Run `batch` against `replicas` replicas (the autoscaler's minimum if
/// `autoscale` is set); `scope` separates the cluster's random streams.
pub fn run(
    profile: Arc<ServerProfile>,
    replicas: u32,
    router: RouterKind,
    autoscale: Option<AutoscaleParams>,
    batch: &Batch,
    seed: u64,
    scope: u64,
) -> BatchResult {
    let mut cluster = Cluster::new(profile, replicas, router, seed.wrapping_add(scope << 32));
    if let Some(p) = autoscale {
        cluster = cluster.with_autoscaler(p);
    }
    let mut rng = stream(seed, 0, component::WORKLOAD);
    let mut sent = 0u64;
    let mut send = |cluster: &mut Cluster, now: Nanos, sent: &mut u64| {
        let input = batch.input_tokens.sample(&mut rng).round().max(1.0) as u64;
        let natural = crate::hosted::natural_output(&batch.output_tokens, &mut rng);
        let output = natural.min(batch.max_tokens);
        cluster.submit(
            now,
            Request {
                id: *sent,
                input_tokens: input.min(u32::MAX as u64) as u32,
                output_tokens: output.min(u32::MAX as u64) as u32,
            },
        );
        *sent += 1;
    };
    for _ in 0..(batch.workers as u64).min(batch.rows) {
        send(&mut cluster, 0, &mut sent);
    }
    let mut r = BatchResult {
        elapsed: 0,
        ok: 0,
        failed: 0,
        ttft: DurationHist::new(),
        e2e: DurationHist::new(),
        gpu_ns: 0,
        replicas_max: 0,
        output_tokens: 0,
        stopped: false,
    };
    let mut tally = Tally::new();
    let scan = step_units(cluster.replica_count());
    let mut steps = 0u64;
    let work = |c: &Cluster, sent: u64, steps: u64| {
        UNITS_PER_REQUEST * (sent + c.iterations()) + scan * steps
    };
    let mut done = 0u64;
    while done < batch.rows {
        if !tally.at(work(&cluster, sent, steps)) {
            r.stopped = true;
            break;
        }
        steps += 1;
        // completions of submits at the current time first
        while let Some(c) = cluster.poll_completion() {
            done += 1;
            r.elapsed = r.elapsed.max(c.finished);
            if c.rejected {
                r.failed += 1;
            } else {
                r.ok += 1;
                r.output_tokens += c.output_tokens as u64;
                r.ttft.record(c.first_token - c.arrival);
                r.e2e.record(c.finished - c.arrival);
            }
            if sent < batch.rows {
                send(&mut cluster, c.finished, &mut sent);
            }
        }
        if done >= batch.rows {
            break;
        }
        let Some(t) = cluster.poll_timeout() else {
            break;
        };
        cluster.handle_timeout(t);
    }
    tally.finish(work(&cluster, sent, steps));
    r.gpu_ns = cluster.gpu_replicas().area(r.elapsed);
    r.replicas_max = cluster.gpu_replicas().max;
    r
}
