//! What a run measured that its records do not hold (for plots): latency
//! histograms pooled over seeds, and a server's samples in the first seed.

use super::ExperimentFile;
use crate::config::ConfigError;
use crate::engine::DurationHist;
use crate::report;
use crate::report::records::Records;
use crate::time::Nanos;

/// Samples of the server's time series per scenario.
pub const SAMPLES: u64 = 240;

/// The sampling interval of a server scenario of `duration`.
pub fn sample_every(duration: Nanos) -> Nanos {
    (duration / SAMPLES).max(1_000_000)
}

/// What a run measured that the records do not hold.
#[derive(Debug, Default, Clone)]
pub struct Extras {
    /// Hosted: (experiment, row latency); server: (scenario, E2E).
    pub latency: Vec<(String, DurationHist)>,
    /// Server: (scenario, samples of the first seed).
    pub series: Vec<(String, super::server::Series)>,
    /// Server, autoscaled or time-varying scenarios: (scenario, its minutes
    /// in the first seed).
    pub minutes: Vec<(String, Vec<super::server::Minute>)>,
}

fn pool(into: &mut Vec<(String, DurationHist)>, name: &str, h: &DurationHist) {
    match into.iter_mut().find(|(n, _)| n == name) {
        Some((_, a)) => a.merge(h),
        None => into.push((name.to_string(), h.clone())),
    }
}

/// [`ExperimentFile::records`], also keeping the [`Extras`]: the same runs,
/// reduced to the same records in the same order.
pub fn records_with_extras(
    ef: &ExperimentFile,
    seed: u64,
    seeds: u64,
) -> Result<(Records, Extras), ConfigError> {
    let mut out = Records::default();
    let mut x = Extras::default();
    for k in 0..seeds {
        let s = seed.wrapping_add(k);
        match ef {
            ExperimentFile::Hosted(suite) => {
                let results = super::hosted::run_suite(suite, s);
                report::hosted::records(&mut out, s, &results);
                for r in &results {
                    pool(&mut x.latency, &r.name, &r.latency);
                }
            }
            ExperimentFile::Server(suite) => {
                let mut results = Vec::with_capacity(suite.scenarios.len());
                for sc in &suite.scenarios {
                    let every = (k == 0).then(|| sample_every(sc.duration));
                    let (r, series) = super::server::run_scenario_sampled(
                        suite.profile.clone(),
                        sc,
                        s,
                        sc.index,
                        every,
                    );
                    if let Some(se) = series {
                        x.series.push((sc.name.clone(), se));
                    }
                    if k == 0 && !r.minutes.is_empty() {
                        x.minutes.push((sc.name.clone(), r.minutes.clone()));
                    }
                    results.push(r);
                }
                report::server::records(&mut out, s, &results);
                for r in &results {
                    pool(&mut x.latency, &r.name, &r.metrics.total(r.until).e2e);
                }
            }
            ExperimentFile::Shared(_) => {
                out.extend_from(&ef.records(s, 1)?);
            }
        }
    }
    Ok((out, x))
}
