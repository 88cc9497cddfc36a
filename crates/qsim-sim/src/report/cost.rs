//! Capacity and cost of server scenarios (issue 25): replicas over time,
//! GPU-hours and, where the profile has a `[price]`, what the run cost:
//! in total, per hour, per million output tokens and per successful
//! request. Recorded (and shown) only for scenarios that autoscale, vary
//! their rate over time, or have a price, so other reports are unchanged.

use super::records::{Records, Spreads};
use super::table::Table;
use super::{fmt_spread, Spread};
use crate::experiment::hosted::HostedResult;
use crate::experiment::server::ServerResult;
use crate::time::to_secs;

/// (record key, label, decimals), in report order; the last four need a price.
pub const COST: &[(&str, &str, i32)] = &[
    ("replicas_mean", "replicas (mean)", 2),
    ("replicas_max", "replicas (max)", 0),
    ("gpu_hours", "GPU-hours (replica-hours)", 2),
    ("cost_usd", "cost ($)", 2),
    ("cost_per_hour_usd", "cost per hour ($)", 2),
    (
        "cost_per_m_output_tokens_usd",
        "cost per 1M output tokens ($)",
        3,
    ),
    ("cost_per_request_usd", "cost per successful request ($)", 6),
];

/// Per minute (`minute.K.<key>`), for autoscaled or time-varying scenarios.
pub const MINUTE: &[&str] = &["replicas", "ready", "arrivals", "ttft_p95_s", "e2e_p95_s"];

fn wanted(r: &ServerResult) -> bool {
    r.autoscaled || r.replica_hour_usd.is_some() || !r.minutes.is_empty()
}

/// The cost figures of one result: `[replicas_mean, replicas_max,
/// gpu_hours]` then, with a price, `[cost, per hour, per 1M output tokens,
/// per successful request]`.
pub fn figures(r: &ServerResult) -> Vec<f64> {
    let hours = to_secs(r.until) / 3600.0;
    let gpu_hours = r.gpu_ns as f64 / 3.6e12;
    let mut v = vec![
        if r.until == 0 {
            0.0
        } else {
            r.gpu_ns as f64 / r.until as f64
        },
        r.replicas_max as f64,
        gpu_hours,
    ];
    if let Some(p) = r.replica_hour_usd {
        let total = r.metrics.total(r.until);
        let cost = gpu_hours * p;
        v.extend([
            cost,
            cost / hours.max(1e-12),
            cost / (total.output_tokens.max(1) as f64) * 1e6,
            cost / (total.completed.max(1) as f64),
        ]);
    }
    v
}

/// Records of one seed's result, if it has cost or per-minute figures.
pub fn records(out: &mut Records, seed: u64, r: &ServerResult) {
    if !wanted(r) {
        return;
    }
    for ((k, _, _), v) in COST.iter().zip(figures(r)) {
        out.push(seed, &r.name, k, v);
    }
    for (i, m) in r.minutes.iter().enumerate() {
        let v = [
            m.replicas,
            m.ready,
            m.arrivals as f64,
            m.ttft_p95_s,
            m.e2e_p95_s,
        ];
        for (k, v) in MINUTE.iter().zip(v) {
            out.push(seed, &r.name, &format!("minute.{i}.{k}"), v);
        }
    }
}

/// A scenario's cost figures over seeds (None if it has none).
pub fn aggregate(name: &str, s: &Spreads) -> Option<Vec<Spread>> {
    s.has(name, "gpu_hours").then(|| {
        COST.iter()
            .filter(|(k, _, _)| s.has(name, k))
            .map(|(k, _, _)| s.get(name, k))
            .collect()
    })
}

/// Minutes recorded for `name`.
pub fn minutes(name: &str, s: &Spreads) -> usize {
    let mut n = 0;
    while s.has(name, &format!("minute.{n}.replicas")) {
        n += 1;
    }
    n
}

/// One hour of a scenario: mean replicas and ready replicas, mean
/// arrivals per minute, and the worst minute's p95 TTFT and E2E.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hour {
    pub replicas: f64,
    pub ready: f64,
    pub arrivals_per_min: f64,
    pub ttft_p95_s: f64,
    pub e2e_p95_s: f64,
}

/// The hours of `name` from its minutes' medians over seeds.
pub fn hours(name: &str, s: &Spreads) -> Vec<Hour> {
    let mins = minutes(name, s);
    let get = |m: usize, key: &str| s.get(name, &format!("minute.{m}.{key}")).median;
    (0..mins.div_ceil(60))
        .map(|h| {
            let ms = h * 60..((h + 1) * 60).min(mins);
            let k = ms.len() as f64;
            let mean = |key: &str| ms.clone().map(|m| get(m, key)).sum::<f64>() / k;
            let worst = |key: &str| ms.clone().map(|m| get(m, key)).fold(0.0, f64::max);
            Hour {
                replicas: mean("replicas"),
                ready: mean("ready"),
                arrivals_per_min: mean("arrivals"),
                ttft_p95_s: worst("ttft_p95_s"),
                e2e_p95_s: worst("e2e_p95_s"),
            }
        })
        .collect()
}

/// What [`render`] shows of one scenario.
pub struct View<'a> {
    pub name: &'a str,
    pub cost: Option<&'a [Spread]>,
    pub hours: &'a [Hour],
}

/// The text: one column per scenario with cost figures, then one table
/// per scenario with hours.
pub fn render(aggs: &[View<'_>], runs: usize) -> String {
    let mut out = String::new();
    let with: Vec<_> = aggs.iter().filter(|a| a.cost.is_some()).collect();
    if !with.is_empty() {
        out.push_str("\ncapacity and cost\n");
        let mut t = Table::new(
            std::iter::once("metric".to_string()).chain(with.iter().map(|a| a.name.to_string())),
        );
        for (i, (_, label, d)) in COST.iter().enumerate() {
            let cells = with.iter().map(|a| {
                a.cost
                    .and_then(|c| c.get(i))
                    .map_or("-".to_string(), |x| fmt_spread(x, *d, runs))
            });
            t.row(std::iter::once(label.to_string()).chain(cells));
        }
        out.push_str(&t.render());
    }
    for a in aggs.iter().filter(|a| !a.hours.is_empty()) {
        out.push_str(&format!(
            "\n{}: per hour (replicas: mean; p95: the hour's worst minute)\n",
            a.name
        ));
        let mut t = Table::new(
            [
                "hour",
                "replicas",
                "ready",
                "arrivals/min",
                "TTFT p95 (s)",
                "E2E p95 (s)",
            ]
            .map(String::from),
        );
        for (h, x) in a.hours.iter().enumerate() {
            t.row([
                format!("{h}"),
                format!("{:.2}", x.replicas),
                format!("{:.2}", x.ready),
                format!("{:.0}", x.arrivals_per_min),
                format!("{:.3}", x.ttft_p95_s),
                format!("{:.2}", x.e2e_p95_s),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

/// (record key, label, decimals) of a pay-per-token run's cost.
pub const HOSTED_COST: &[(&str, &str, i32)] = &[
    ("cost_usd", "cost ($)", 4),
    ("cost_per_hour_usd", "cost per hour ($)", 2),
    (
        "cost_per_m_output_tokens_usd",
        "cost per 1M output tokens ($)",
        3,
    ),
    ("cost_per_request_usd", "cost per successful request ($)", 6),
];

/// A hosted run's cost ([`HOSTED_COST`] order), if the endpoint has
/// prices: pay-per-token, the input and output tokens of the rows that
/// succeeded × their prices (rejected attempts are not billed);
/// provisioned, units × elapsed hours × the unit-hour price, whatever the
/// use. Rates are over the run's elapsed time.
pub fn hosted_figures(r: &HostedResult) -> Option<Vec<f64>> {
    let hours = to_secs(r.elapsed) / 3600.0;
    let cost = match (r.provisioned, r.price) {
        // several upstreams: each billed its own way
        _ if !r.upstreams.is_empty() => r.upstream_cost?,
        (Some(p), _) => p.cost(hours),
        (None, Some(p)) => {
            r.input_tokens as f64 * p.input_per_m_usd / 1e6
                + r.output_tokens as f64 * p.output_per_m_usd / 1e6
        }
        (None, None) => return None,
    };
    Some(vec![
        cost,
        cost / hours.max(1e-12),
        cost / (r.output_tokens.max(1) as f64) * 1e6,
        cost / (r.ok.max(1) as f64),
    ])
}

/// Records of a pay-per-token run's cost (none without prices).
pub fn hosted_records(out: &mut Records, seed: u64, r: &HostedResult) {
    if let Some(v) = hosted_figures(r) {
        for ((k, _, _), v) in HOSTED_COST.iter().zip(v) {
            out.push(seed, &r.name, k, v);
        }
    }
}

/// A pay-per-token experiment's cost over seeds (None without prices).
pub fn hosted_aggregate(name: &str, s: &Spreads) -> Option<Vec<Spread>> {
    s.has(name, "cost_usd")
        .then(|| HOSTED_COST.iter().map(|(k, _, _)| s.get(name, k)).collect())
}
