//! The work budget of a plan (see [`crate::budget`]): the
//! scenarios' loads through the limiter and without it, and each step of
//! the inverse search.

use super::config::{Arrival, SharedFile, TraceTo};
use super::Model;
use crate::budget::{
    hists_bytes, iterations, min_step_s, open_requests, replicas_bytes, Cost, IN_FLIGHT_BYTES,
    RECORD_BYTES,
};
use crate::config::ConfigError;
use crate::time::{show, to_secs};

/// The ideal server's TTFT and ITL (see `sim::IdealBackend::seed_nim`).
const IDEAL_TTFT_S: f64 = 0.035;
const IDEAL_ITL_S: f64 = 0.018;

/// The cost of running every scenario once: through the limiter, and (if
/// `counterfactual`) again without it; open loads scaled by `factor` (the
/// inverse search scales them with capacity).
pub fn scenarios(
    f: &SharedFile,
    model: &Model,
    factor: f64,
    counterfactual: bool,
) -> Result<Cost, ConfigError> {
    let mut c = Cost::default();
    let mean_out = f.output_tokens.mean().clamp(1.0, u32::MAX as f64 / 4.0);
    let service_s = match model {
        Model::Ideal => IDEAL_TTFT_S + IDEAL_ITL_S * (mean_out - 1.0),
        Model::Server { profile, .. } => to_secs(profile.ingress) + min_step_s(profile) * mean_out,
    };
    let reject_s = to_secs(f.reject_latency);
    let runs = if counterfactual { 2.0 } else { 1.0 };
    let reps = f.replicas as f64;
    let mut kept_outcomes = 0.0;
    for s in &f.scenarios {
        // expected first tries (the work estimate leans low: retries are
        // counted as they run); with retries and the count's spread for
        // the memory estimate
        let mut requests = 0.0;
        let mut requests_hi = 0.0;
        let mut in_flight = 0.0;
        for (li, l) in s.loads.iter().enumerate() {
            let n = f.resolve(&l.who).len() as f64;
            let d = to_secs(l.stop.saturating_sub(l.start));
            // every caller-level attempt with its SDK retries
            let sdk = l.caller.sdk.as_ref().map_or(0, |s| s.max_retries) as f64;
            let attempts = l.caller.retry.max_attempts.max(1) as f64 * (1.0 + sdk);
            match &l.arrival {
                Arrival::Open { rpm, ramp_to_rpm } => {
                    let rate = (rpm + ramp_to_rpm) / 2.0 / 60.0 * factor;
                    let r = n * open_requests(rate, d, 1.0);
                    requests += n * rate * d;
                    requests_hi += r * attempts;
                    in_flight += r;
                }
                Arrival::Trace { spec, to } => {
                    // the trace's rows (all loops, at its scale) for each
                    // source: every consumer, or one for a trace naming them
                    let sources = match to {
                        TraceTo::Each => n,
                        TraceTo::Mapped(_) => 1.0,
                    };
                    let rows = spec.expected().map_or(0.0, |(r, _)| r) * factor;
                    let r = sources * rows;
                    requests += r;
                    requests_hi += r * attempts;
                    in_flight += r;
                }
                Arrival::Closed { workers, think } => {
                    let cycle = to_secs(*think) + reject_s.min(service_s);
                    if cycle <= 0.0 {
                        return Err(ConfigError::new(
                            &f.source,
                            format!("scenario.{}.load.{li}.think_s", s.index),
                            "closed-loop workers with think_s = 0 and reject_latency_ms = 0 could send again without time passing; give either a time > 0",
                        ));
                    }
                    let r = n * *workers as f64 * d / cycle;
                    requests += r;
                    requests_hi += r * attempts;
                    in_flight += n * *workers as f64;
                }
            }
        }
        let its = match model {
            Model::Server { profile, .. } => {
                iterations(profile, reps, to_secs(s.duration), requests, mean_out)
            }
            Model::Ideal => 0.0,
        };
        // the outcome of each run keeps three histograms until the seed is
        // reduced (E2E, TTFT, mean ITL: a sample per completed request)
        kept_outcomes += runs * 3.0 * hists_bytes(1.0, requests_hi);
        let backend = match model {
            Model::Ideal => 0.0,
            Model::Server { .. } => replicas_bytes(reps, requests_hi, requests_hi * mean_out),
        };
        let what = format!(
            "scenario {:?}{}",
            s.name,
            if counterfactual {
                " with and without the limiter"
            } else {
                ""
            }
        );
        c.part(
            &what,
            runs * (requests + its),
            backend + in_flight * IN_FLIGHT_BYTES + kept_outcomes,
        );
        let minutes = (to_secs(s.duration) / 60.0).ceil();
        c.keep(f.limiter.consumers.len() as f64 * (12.0 + minutes) * RECORD_BYTES);
    }
    Ok(c)
}

/// One seed of the plan (through the limiter and without it).
pub fn simulate(f: &SharedFile, model: &Model) -> Result<Cost, ConfigError> {
    scenarios(f, model, 1.0, true)
}

/// One step of the inverse search at `capacity` (loads scaled to it).
pub fn search_step(
    f: &SharedFile,
    model: &Model,
    capacity: u64,
    replicas: u32,
) -> Result<Cost, ConfigError> {
    let factor = capacity as f64 / f.limiter.capacity as f64;
    let mut g = f.clone();
    g.replicas = replicas;
    let mut c = scenarios(&g, model, factor, false)?;
    if let Some((w, _)) = &mut c.largest {
        *w = format!(
            "{w}, loads scaled x {} to capacity {capacity}",
            show((factor * 100.0).round() / 100.0)
        );
    }
    Ok(c)
}
