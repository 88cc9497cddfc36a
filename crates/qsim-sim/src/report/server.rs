//! Reports for server suites: per scenario, the aggregate over replicas and
//! each replica, plus snapshots of the queue at chosen times; table and JSON.

use super::records::{Records, Spreads};
use super::table::Table;
use super::{round, Spread};
use crate::experiment::server::{Load, ServerResult, ServerSuite};
use crate::server::ReplicaMetrics;
use crate::time::{to_secs, Nanos};
use serde_json::{json, Map, Value};

/// (JSON name, label, decimals) of every reported metric, in report order.
pub const METRICS: &[(&str, &str, i32)] = &[
    ("ttft_p50_s", "TTFT p50 (s)", 4),
    ("ttft_p99_s", "TTFT p99 (s)", 4),
    ("ttft_mean_s", "TTFT mean (s)", 4),
    ("itl_p50_s", "ITL p50 (s)", 4),
    ("itl_p99_s", "ITL p99 (s)", 4),
    ("itl_mean_s", "ITL mean (s)", 4),
    ("tpot_p50_s", "TPOT p50 (s)", 4),
    ("e2e_p50_s", "E2E p50 (s)", 3),
    ("e2e_p99_s", "E2E p99 (s)", 3),
    ("e2e_mean_s", "E2E mean (s)", 3),
    ("queue_p50_s", "queue delay p50 (s)", 4),
    ("queue_p99_s", "queue delay p99 (s)", 4),
    ("gpu_util", "GPU utilization", 3),
    ("engine_util", "engine busy fraction", 3),
    ("kv_util", "KV cache utilization (mean)", 4),
    ("kv_util_max", "KV cache utilization (max)", 4),
    ("concurrency_mean", "concurrency (mean)", 2),
    ("running_mean", "running batch (mean)", 2),
    ("waiting_mean", "waiting (mean)", 2),
    ("throughput_rps", "throughput (req/s)", 3),
    ("throughput_rpm", "throughput (req/min)", 1),
    ("submitted", "submitted", 0),
    ("completed", "completed", 0),
    ("rejected", "rejected", 0),
    ("preemptions", "preemptions", 0),
    ("input_tokens_per_min", "input tokens/min", 0),
    ("output_tokens_per_min", "output tokens/min", 0),
    ("iterations", "iterations", 0),
];

/// The values of [`METRICS`] for one replica (or the sum of all; `n` is the
/// number of replicas summed, for averaging utilisations).
pub fn values(m: &ReplicaMetrics, until: Nanos, n: usize) -> Vec<f64> {
    let el = to_secs(until).max(1e-12);
    let n = n.max(1) as f64;
    vec![
        m.ttft.quantile_s(0.5),
        m.ttft.quantile_s(0.99),
        m.ttft.mean_s(),
        m.itl.quantile_s(0.5),
        m.itl.quantile_s(0.99),
        m.itl.mean_s(),
        m.tpot.quantile_s(0.5),
        m.e2e.quantile_s(0.5),
        m.e2e.quantile_s(0.99),
        m.e2e.mean_s(),
        m.queue_delay.quantile_s(0.5),
        m.queue_delay.quantile_s(0.99),
        // busy time summed over `n` replicas, averaged before clamping
        (m.gpu_busy_ns as f64 / until.max(1) as f64 / n).min(1.0),
        (m.engine_busy_ns as f64 / until.max(1) as f64 / n).min(1.0),
        m.kv_util(until),
        m.kv_util_max(),
        m.concurrency_mean(until),
        m.running.mean(until),
        m.waiting.mean(until),
        m.completed as f64 / el,
        m.completed as f64 / el * 60.0,
        m.submitted as f64,
        m.completed as f64,
        m.rejected as f64,
        m.preemptions as f64,
        m.input_tokens as f64 / el * 60.0,
        m.output_tokens as f64 / el * 60.0,
        m.iterations as f64,
    ]
}

/// Above this many replicas the text report summarises them (min, median,
/// max across replicas) instead of printing one column each; the JSON and
/// the records keep every replica.
pub const MAX_REPLICA_COLUMNS: usize = 8;

/// Snapshot fields, in order.
pub const SNAPSHOT: &[(&str, i32)] = &[
    ("waiting", 0),
    ("running", 0),
    ("outstanding", 0),
    ("completed", 0),
    ("e2e_p50_s", 3),
    ("e2e_max_s", 3),
    ("gpu_util", 3),
    ("kv_util", 4),
    ("preemptions", 0),
];

/// One scenario aggregated over seeds.
pub struct Aggregate {
    pub name: String,
    pub load: String,
    pub replicas: usize,
    /// `N`, or `min-max auto` when the scenario autoscales.
    pub replicas_label: String,
    /// Capacity and cost figures ([`super::cost::COST`] order), if recorded.
    pub cost: Option<Vec<Spread>>,
    /// Per hour of an autoscaled or time-varying scenario (medians over seeds).
    pub hours: Vec<super::cost::Hour>,
    pub runs: usize,
    /// Aggregate over replicas: one spread per metric.
    pub total: Vec<Spread>,
    /// Per replica: one spread per metric.
    pub per_replica: Vec<Vec<Spread>>,
    pub unfinished: Spread,
    /// Per snapshot: time and one spread per snapshot field.
    pub snapshots: Vec<(f64, Vec<Spread>)>,
}

fn load_label(l: &Load) -> String {
    match l {
        Load::Open { rpm, process } => format!("{rpm} RPM {}", process.kind),
        Load::Closed { clients, .. } => format!("{clients} closed-loop clients"),
        Load::Trace(t) => format!("trace {}", t.label()),
    }
}

fn replica_metric(k: usize, key: &str) -> String {
    format!("replica.{k}.{key}")
}

fn snapshot_metric(k: usize, key: &str) -> String {
    format!("snapshot.{k}.{key}")
}

/// One seed's results as tidy records (subject: the scenario): the
/// aggregate over replicas, each replica (`replica.K.metric`), requests left
/// unfinished, and each snapshot (`snapshot.K.field`, with its time `t_s`).
pub fn records(out: &mut Records, seed: u64, results: &[ServerResult]) {
    for r in results {
        let nrep = r.metrics.replicas.len();
        let mut total = values(&r.metrics.total(r.until), r.until, nrep);
        if r.autoscaled {
            // utilisations over the GPU time the replicas held, not over
            // every slot for the whole run
            let t = r.metrics.total(r.until);
            let gpu = r.gpu_ns.max(1) as f64;
            total[12] = (t.gpu_busy_ns as f64 / gpu).min(1.0);
            total[13] = (t.engine_busy_ns as f64 / gpu).min(1.0);
        }
        for ((key, _, _), v) in METRICS.iter().zip(total) {
            out.push(seed, &r.name, key, v);
        }
        // autoscaled: replica slots come and go; no per-replica records
        for (k, m) in r
            .metrics
            .replicas
            .iter()
            .enumerate()
            .filter(|_| !r.autoscaled)
        {
            for ((key, _, _), v) in METRICS.iter().zip(values(m, r.until, 1)) {
                out.push(seed, &r.name, &replica_metric(k, key), v);
            }
        }
        super::cost::records(out, seed, r);
        out.push(seed, &r.name, "unfinished", r.unfinished as f64);
        for (k, s) in r.snapshots.iter().enumerate() {
            let v = [
                s.waiting as f64,
                s.running as f64,
                s.outstanding as f64,
                s.completed as f64,
                s.e2e_p50_s,
                s.e2e_max_s,
                s.gpu_util,
                s.kv_util,
                s.preemptions as f64,
            ];
            out.push(seed, &r.name, &snapshot_metric(k, "t_s"), to_secs(s.t));
            for ((key, _), v) in SNAPSHOT.iter().zip(v) {
                out.push(seed, &r.name, &snapshot_metric(k, key), v);
            }
        }
    }
}

/// One entry per scenario of the suite, from the spreads of its records.
pub fn aggregate(suite: &ServerSuite, s: &Spreads) -> Vec<Aggregate> {
    suite
        .scenarios
        .iter()
        .map(|sc| {
            let name = &sc.name;
            let nrep = if sc.autoscale.is_some() {
                0
            } else {
                sc.replicas as usize
            };
            let metrics = |f: &dyn Fn(&str) -> String| -> Vec<Spread> {
                METRICS.iter().map(|(k, _, _)| s.get(name, &f(k))).collect()
            };
            Aggregate {
                name: name.clone(),
                load: load_label(&sc.load),
                replicas: nrep,
                replicas_label: match &sc.autoscale {
                    Some(p) => format!("{}-{} auto", p.min, p.max),
                    None => sc.replicas.to_string(),
                },
                cost: super::cost::aggregate(name, s),
                hours: super::cost::hours(name, s),
                runs: s.runs,
                total: metrics(&|k| k.to_string()),
                per_replica: (0..nrep)
                    .map(|r| metrics(&|k| replica_metric(r, k)))
                    .collect(),
                unfinished: s.get(name, "unfinished"),
                snapshots: (0..sc.snapshots.len())
                    .map(|k| {
                        let t = s.get(name, &snapshot_metric(k, "t_s")).median;
                        let v = SNAPSHOT
                            .iter()
                            .map(|(f, _)| s.get(name, &snapshot_metric(k, f)))
                            .collect();
                        (t, v)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The text report: one column per scenario (aggregate over replicas), then
/// per-replica tables when there are several replicas, then snapshots.
pub fn render_table(suite: &ServerSuite, file: &str, seed: u64, aggs: &[Aggregate]) -> String {
    let runs = aggs.first().map_or(1, |a| a.runs);
    let mut out = super::header(
        &suite.title,
        &format!(
            "file {file}, server {} ({})",
            suite.profile.name, suite.profile_path
        ),
        seed,
        runs,
    );
    let mut t = Table::new(
        std::iter::once("metric".to_string()).chain(aggs.iter().map(|a| a.name.clone())),
    );
    t.row(std::iter::once("load".to_string()).chain(aggs.iter().map(|a| a.load.clone())));
    t.row(
        std::iter::once("replicas".to_string())
            .chain(aggs.iter().map(|a| a.replicas_label.clone())),
    );
    for (m, (_, label, d)) in METRICS.iter().enumerate() {
        t.row(
            std::iter::once(label.to_string()).chain(
                aggs.iter()
                    .map(|a| super::fmt_spread(&a.total[m], *d, runs)),
            ),
        );
    }
    t.row(
        std::iter::once("unfinished at end".to_string()).chain(
            aggs.iter()
                .map(|a| super::fmt_spread(&a.unfinished, 0, runs)),
        ),
    );
    out.push_str(&t.render());
    for a in aggs.iter().filter(|a| a.replicas > MAX_REPLICA_COLUMNS) {
        // many replicas: the spread across replicas of each one's median
        out.push_str(&format!(
            "\n{}: across {} replicas (each replica's median over seeds)\n",
            a.name, a.replicas
        ));
        let mut t = Table::new(["metric", "min", "median", "max"].map(String::from));
        for (m, (_, label, d)) in METRICS.iter().enumerate() {
            let v: Vec<f64> = a.per_replica.iter().map(|r| r[m].median).collect();
            let s = super::spread(&v);
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let f = |x: f64| {
                super::fmt_spread(
                    &Spread {
                        median: x,
                        lo: x,
                        hi: x,
                    },
                    *d,
                    1,
                )
            };
            t.row([label.to_string(), f(lo), f(s.median), f(hi)]);
        }
        out.push_str(&t.render());
    }
    for a in aggs
        .iter()
        .filter(|a| a.replicas > 1 && a.replicas <= MAX_REPLICA_COLUMNS)
    {
        out.push_str(&format!("\n{}: per replica\n", a.name));
        let mut t = Table::new(
            std::iter::once("metric".to_string())
                .chain((0..a.replicas).map(|k| format!("replica {k}"))),
        );
        for (m, (_, label, d)) in METRICS.iter().enumerate() {
            t.row(
                std::iter::once(label.to_string()).chain(
                    a.per_replica
                        .iter()
                        .map(|r| super::fmt_spread(&r[m], *d, runs)),
                ),
            );
        }
        out.push_str(&t.render());
    }
    let views: Vec<super::cost::View> = aggs
        .iter()
        .map(|a| super::cost::View {
            name: &a.name,
            cost: a.cost.as_deref(),
            hours: &a.hours,
        })
        .collect();
    out.push_str(&super::cost::render(&views, runs));
    for a in aggs.iter().filter(|a| !a.snapshots.is_empty()) {
        out.push_str(&format!(
            "\n{}: snapshots (E2E and GPU utilization since the previous snapshot)\n",
            a.name
        ));
        let mut t = Table::new(
            std::iter::once("time (s)".to_string())
                .chain(SNAPSHOT.iter().map(|(k, _)| k.to_string())),
        );
        for (ts, v) in &a.snapshots {
            t.row(
                std::iter::once(format!("{ts}")).chain(
                    SNAPSHOT
                        .iter()
                        .zip(v)
                        .map(|((_, d), s)| super::fmt_spread(s, *d, runs)),
                ),
            );
        }
        out.push_str(&t.render());
    }
    out
}

fn num(x: f64, d: i32) -> Value {
    if d == 0 {
        json!(x.round() as i64)
    } else {
        json!(round(x, d.max(4)))
    }
}

fn obj(keys: impl Iterator<Item = (&'static str, i32)>, v: &[Spread], runs: usize) -> Value {
    let mut o = Map::new();
    let mut iv = Map::new();
    for ((k, d), s) in keys.zip(v) {
        o.insert(k.into(), num(s.median, d));
        iv.insert(k.into(), json!([num(s.lo, d), num(s.hi, d)]));
    }
    if runs > 1 {
        o.insert("interval90".into(), Value::Object(iv));
    }
    Value::Object(o)
}

/// The JSON report: `scenarios[]` each with `total` (aggregate over
/// replicas), `replicas[]` and `snapshots[]`; with several seeds every field
/// is the median and `interval90` holds [5th, 95th] percentiles.
pub fn render_json(suite: &ServerSuite, file: &str, seed: u64, aggs: &[Aggregate]) -> Value {
    let runs = aggs.first().map_or(1, |a| a.runs);
    let keys = || METRICS.iter().map(|(k, _, d)| (*k, *d));
    let sc: Vec<Value> = aggs
        .iter()
        .map(|a| {
            let snaps: Vec<Value> = a
                .snapshots
                .iter()
                .map(|(t, v)| {
                    let mut o = obj(SNAPSHOT.iter().copied(), v, runs);
                    o.as_object_mut().expect("object").insert("t_s".into(), json!(t));
                    o
                })
                .collect();
            json!({
                "name": a.name,
                "load": a.load,
                "replicas": a.replicas,
                "unfinished": num(a.unfinished.median, 0),
                "total": obj(keys(), &a.total, runs),
                "per_replica": a.per_replica.iter().map(|r| obj(keys(), r, runs)).collect::<Vec<_>>(),
                "snapshots": snaps,
            })
        })
        .collect();
    let mut sc = sc;
    for (v, a) in sc.iter_mut().zip(aggs) {
        if let Some(c) = &a.cost {
            let o = v.as_object_mut().expect("object");
            o.insert("autoscale".into(), json!(a.replicas_label));
            o.insert(
                "cost".into(),
                obj(super::cost::COST.iter().map(|(k, _, d)| (*k, *d)), c, runs),
            );
        }
    }
    json!({
        "file": file,
        "title": suite.title,
        "server": suite.profile.name,
        "seed": seed,
        "seeds": runs,
        "scenarios": sc,
    })
}

/// Run a suite over `seeds` seeds from `seed` and render it (JSON or table).
/// The metrics shown per grid point in a sweep table.
pub const SWEEP_COLS: &[&str] = &[
    "throughput_rpm",
    "ttft_p50_s",
    "itl_p50_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "gpu_util",
    "kv_util",
    "concurrency_mean",
    "waiting_mean",
    "preemptions",
];

/// Sweep rows: one per scenario, the aggregate over replicas.
pub fn sweep_rows(aggs: &[Aggregate]) -> Vec<super::sweep::Row> {
    aggs.iter()
        .map(|a| super::sweep::Row {
            name: a.name.clone(),
            metrics: METRICS
                .iter()
                .zip(&a.total)
                .map(|((k, _, d), s)| (*k, *d, *s))
                .collect(),
        })
        .collect()
}
