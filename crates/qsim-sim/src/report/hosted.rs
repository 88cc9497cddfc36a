//! Reports for hosted-API suites: the article's `show()` block per
//! experiment, the experiments side by side, and JSON.

use super::records::{Records, Spreads};
use super::table::Table;
use super::{round, Spread};
use crate::experiment::config::ClientKind;
use crate::experiment::hosted::HostedResult;
use crate::experiment::HostedSuite;
use serde_json::{json, Map, Value};

/// (JSON name, label, decimals) for every reported metric, in report order.
pub const METRICS: &[(&str, &str, i32)] = &[
    ("elapsed_s", "elapsed (s)", 1),
    ("ok", "succeeded", 0),
    ("total", "total", 0),
    ("rejected_429", "429 surfaced", 0),
    ("failed_other", "other errors", 0),
    ("latency_p50_s", "latency p50 (s)", 2),
    ("latency_p95_s", "latency p95 (s)", 2),
    ("own_wait_s", "total own sleep (s)", 1),
    ("output_tokens", "output tokens", 0),
    ("truncated", "rows cut by max_tokens", 0),
    ("throughput_rows_per_s", "throughput (ok rows/s)", 2),
    ("retried", "rows retried by caller", 0),
    ("max_attempts", "max attempts of a row", 0),
    ("max_wait_s", "max own wait of a row (s)", 1),
    ("sleeping_workers", "workers asleep on average", 1),
    ("http_requests", "HTTP requests", 0),
    ("http_429", "HTTP 429s (incl. hidden)", 0),
    ("sdk_retries", "SDK hidden retries", 0),
    ("local_rejects", "rejected by own throttle", 0),
    ("quota_denied", "retries refused by quota", 0),
];

fn values(r: &HostedResult) -> Vec<f64> {
    let el = r.elapsed as f64 / 1e9;
    vec![
        el,
        r.ok as f64,
        r.total as f64,
        r.rejected_429 as f64,
        r.failed_other as f64,
        r.latency.quantile_s(0.50),
        r.latency.quantile_s(0.95),
        r.own_wait as f64 / 1e9,
        r.output_tokens as f64,
        r.truncated as f64,
        r.throughput(),
        r.retried as f64,
        r.max_attempts as f64,
        r.max_wait as f64 / 1e9,
        if el > 0.0 {
            r.own_wait as f64 / 1e9 / el
        } else {
            0.0
        },
        r.http_requests as f64,
        r.http_429 as f64,
        r.sdk_retries as f64,
        r.local_rejects as f64,
        r.quota_denied as f64,
    ]
}

/// One experiment aggregated over seeds.
pub struct Aggregate {
    pub name: String,
    pub client: &'static str,
    pub spreads: Vec<Spread>,
    pub limit_hits: Vec<(String, Spread)>,
    /// Pay-per-token cost ([`super::cost::HOSTED_COST`] order), if priced.
    pub cost: Option<Vec<Spread>>,
    /// Several upstreams: per upstream, [`UPSTREAM`] in order; and the
    /// gateway's refusals (limited, unavailable).
    pub upstreams: Vec<(String, Vec<Spread>)>,
    pub refused: Option<[Spread; 2]>,
    pub runs: usize,
}

fn limit_metric(limit: &str) -> String {
    format!("http_429_by_limit.{limit}")
}

/// (record key, label) of each upstream's counts (several upstreams
/// behind a route), recorded as `upstream.NAME.KEY`; and the gateway's
/// refusals (`gateway_refused.limited`, `.unavailable`).
pub const UPSTREAM: &[(&str, &str)] = &[
    ("sent", "attempts sent"),
    ("ok", "requests answered"),
    ("http_429", "429s"),
    ("failures", "failures (5xx, timeout, refused)"),
    ("cooldowns", "cooldowns"),
    ("opened", "circuit opened"),
];

fn upstream_records(out: &mut Records, seed: u64, r: &HostedResult) {
    for u in &r.upstreams {
        let v = [u.sent, u.ok, u.http_429, u.failures, u.cooldowns, u.opened];
        for ((k, _), v) in UPSTREAM.iter().zip(v) {
            out.push(seed, &r.name, &format!("upstream.{}.{k}", u.name), v as f64);
        }
    }
    if !r.upstreams.is_empty() {
        out.push(
            seed,
            &r.name,
            "gateway_refused.limited",
            r.gateway_refused[0] as f64,
        );
        out.push(
            seed,
            &r.name,
            "gateway_refused.unavailable",
            r.gateway_refused[1] as f64,
        );
    }
}

fn upstream_spreads(suite: &HostedSuite, name: &str, s: &Spreads) -> Vec<(String, Vec<Spread>)> {
    let Some(r) = &suite.routes else {
        return Vec::new();
    };
    r.core
        .upstreams
        .iter()
        .map(|u| {
            let v = UPSTREAM
                .iter()
                .map(|(k, _)| s.get(name, &format!("upstream.{}.{k}", u.name)))
                .collect();
            (u.name.clone(), v)
        })
        .collect()
}

/// One seed's results as tidy records (subject: the experiment).
pub fn records(out: &mut Records, seed: u64, results: &[HostedResult]) {
    for r in results {
        for ((key, _, _), v) in METRICS.iter().zip(values(r)) {
            out.push(seed, &r.name, key, v);
        }
        for (limit, n) in &r.limit_hits {
            out.push(seed, &r.name, &limit_metric(limit), *n as f64);
        }
        upstream_records(out, seed, r);
        super::cost::hosted_records(out, seed, r);
    }
}

/// One entry per experiment of the suite, from the spreads of its records.
pub fn aggregate(suite: &HostedSuite, s: &Spreads) -> Vec<Aggregate> {
    suite
        .experiments
        .iter()
        .map(|e| Aggregate {
            name: e.name.clone(),
            client: match e.client {
                ClientKind::Pool { .. } => "pool",
                ClientKind::Managed(_) => "managed",
            },
            spreads: METRICS.iter().map(|(k, _, _)| s.get(&e.name, k)).collect(),
            limit_hits: suite
                .limit_names()
                .into_iter()
                .map(|l| {
                    let v = s.get(&e.name, &limit_metric(&l));
                    (l, v)
                })
                .collect(),
            upstreams: upstream_spreads(suite, &e.name, s),
            refused: suite.routes.as_ref().map(|_| {
                [
                    s.get(&e.name, "gateway_refused.limited"),
                    s.get(&e.name, "gateway_refused.unavailable"),
                ]
            }),
            cost: super::cost::hosted_aggregate(&e.name, s),
            runs: s.runs,
        })
        .collect()
}

/// The text report.
pub fn render_table(suite: &HostedSuite, file: &str, seed: u64, aggs: &[Aggregate]) -> String {
    let runs = aggs.first().map_or(1, |a| a.runs);
    let mut out = super::header(
        &suite.title,
        &format!(
            "file {file}, endpoint {} ({})",
            suite.profile.name, suite.profile_path
        ),
        seed,
        runs,
    );
    let mut t = Table::new(
        std::iter::once("metric".to_string()).chain(aggs.iter().map(|a| a.name.clone())),
    );
    t.row(std::iter::once("client".to_string()).chain(aggs.iter().map(|a| a.client.to_string())));
    for (m, (_, label, d)) in METRICS.iter().enumerate() {
        t.row(
            std::iter::once(label.to_string()).chain(
                aggs.iter()
                    .map(|a| super::fmt_spread(&a.spreads[m], *d, runs)),
            ),
        );
    }
    if let Some(first) = aggs.first() {
        for (k, (name, _)) in first.limit_hits.iter().enumerate() {
            t.row(
                std::iter::once(format!("HTTP 429s from {name}")).chain(
                    aggs.iter()
                        .map(|a| super::fmt_spread(&a.limit_hits[k].1, 0, runs)),
                ),
            );
        }
    }
    if let Some(first) = aggs.first() {
        for (k, (name, _)) in first.upstreams.iter().enumerate() {
            for (m, (_, label)) in UPSTREAM.iter().enumerate() {
                t.row(
                    std::iter::once(format!("upstream {name}: {label}")).chain(
                        aggs.iter()
                            .map(|a| super::fmt_spread(&a.upstreams[k].1[m], 0, runs)),
                    ),
                );
            }
        }
        if first.refused.is_some() {
            for (k, label) in [
                "refused by the gateway: limited",
                "refused by the gateway: unavailable",
            ]
            .iter()
            .enumerate()
            {
                t.row(
                    std::iter::once(label.to_string()).chain(aggs.iter().map(|a| {
                        a.refused
                            .map_or("-".to_string(), |r| super::fmt_spread(&r[k], 0, runs))
                    })),
                );
            }
        }
    }
    if aggs.iter().any(|a| a.cost.is_some()) {
        for (k, (_, label, d)) in super::cost::HOSTED_COST.iter().enumerate() {
            t.row(
                std::iter::once(label.to_string()).chain(aggs.iter().map(|a| {
                    a.cost
                        .as_ref()
                        .map_or("-".to_string(), |c| super::fmt_spread(&c[k], *d, runs))
                })),
            );
        }
    }
    out.push_str(&t.render());
    out
}

/// The JSON report: a top-level `experiments` array; with several seeds each
/// field is the median and `interval90` holds [5th, 95th] percentiles.
pub fn render_json(suite: &HostedSuite, file: &str, seed: u64, aggs: &[Aggregate]) -> Value {
    let runs = aggs.first().map_or(1, |a| a.runs);
    let exps: Vec<Value> = aggs
        .iter()
        .map(|a| {
            let mut o = Map::new();
            o.insert("name".into(), json!(a.name));
            o.insert("client".into(), json!(a.client));
            let mut iv = Map::new();
            for (m, (key, _, d)) in METRICS.iter().enumerate() {
                let s = a.spreads[m];
                o.insert((*key).into(), num(s.median, *d));
                iv.insert((*key).into(), json!([num(s.lo, *d), num(s.hi, *d)]));
            }
            let hits: Map<String, Value> = a
                .limit_hits
                .iter()
                .map(|(n, s)| (n.clone(), num(s.median, 0)))
                .collect();
            o.insert("http_429_by_limit".into(), Value::Object(hits));
            if !a.upstreams.is_empty() {
                let ups: Map<String, Value> = a
                    .upstreams
                    .iter()
                    .map(|(n, v)| {
                        let m: Map<String, Value> = UPSTREAM
                            .iter()
                            .zip(v)
                            .map(|((k, _), s)| ((*k).to_string(), num(s.median, 0)))
                            .collect();
                        (n.clone(), Value::Object(m))
                    })
                    .collect();
                o.insert("upstreams".into(), Value::Object(ups));
            }
            if let Some(r) = a.refused {
                o.insert(
                    "gateway_refused".into(),
                    json!({"limited": num(r[0].median, 0), "unavailable": num(r[1].median, 0)}),
                );
            }
            if let Some(c) = &a.cost {
                let cost: Map<String, Value> = super::cost::HOSTED_COST
                    .iter()
                    .zip(c)
                    .map(|((k, _, d), s)| ((*k).to_string(), num(s.median, *d)))
                    .collect();
                o.insert("cost".into(), Value::Object(cost));
            }
            if runs > 1 {
                o.insert("interval90".into(), Value::Object(iv));
            }
            Value::Object(o)
        })
        .collect();
    json!({
        "file": file,
        "title": suite.title,
        "endpoint": suite.profile.name,
        "seed": seed,
        "seeds": runs,
        "experiments": exps,
    })
}

fn num(x: f64, d: i32) -> Value {
    if d == 0 {
        json!(x.round() as i64)
    } else {
        json!(round(x, d.max(3)))
    }
}

/// The metrics shown per grid point in a sweep table.
pub const SWEEP_COLS: &[&str] = &[
    "ok",
    "rejected_429",
    "elapsed_s",
    "latency_p50_s",
    "latency_p95_s",
    "own_wait_s",
    "http_429",
    "truncated",
    "throughput_rows_per_s",
];

/// Sweep rows: one per experiment, every metric.
pub fn sweep_rows(aggs: &[Aggregate]) -> Vec<super::sweep::Row> {
    aggs.iter()
        .map(|a| super::sweep::Row {
            name: a.name.clone(),
            metrics: METRICS
                .iter()
                .zip(&a.spreads)
                .map(|((k, _, d), s)| (*k, *d, *s))
                .collect(),
        })
        .collect()
}
