//! `qsim load`: play a shared-deployment scenario against a real endpoint
//! and report it in the plan's records, optionally beside the plan's
//! prediction (`--compare-with-sim`).
//!
//! This module reads the scenario file (the same loader and flags checks as
//! `qsim plan`), compiles one scenario into a [`qsim_live::load::LoadConfig`]
//! — open-loop arrivals from `plan::sim::open_arrivals`, the rule the
//! simulator's event loop draws them by; closed-loop workers; each load's
//! caller layers (own retries, SDK retries); each consumer's key — and hands
//! the scenario's other streams (input lengths per consumer, client jitter)
//! to the tokio driver in `crates/qsim-live/src/load.rs`, which runs every
//! row through the core's `Call`. The observed counts become tidy records
//! (seed, subject, metric, value) with the subjects and metric names of
//! `plan::seeds::records`.

use qsim_core::stats::quantile;
use qsim_live::load::{Arrival, Draws, Identity, LoadConfig, LoadReport, Units, Worker};
use qsim_sim::client::PoolShared;
use qsim_sim::config::ConfigError;
use qsim_sim::engine::rng::unit;
use qsim_sim::engine::Rng;
use qsim_sim::limiter::Unit;
use qsim_sim::plan::config::{Arrival as PlanArrival, SharedFile};
use qsim_sim::plan::seeds::consumer_subject;
use qsim_sim::plan::sim;
use qsim_sim::plan::PlanSpec;
use qsim_sim::report::records::{PointRecords, Records};
use qsim_sim::report::table::Table;
use qsim_sim::report::Format;
use qsim_sim::time::Nanos;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// What `qsim load` is asked (a plain spec; the fields are the flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The shared-deployment scenario file (kind = "shared");
    /// `builtin:experiments/shared-deployment.toml` for the embedded one.
    pub file: PathBuf,
    /// Base URL of the endpoint (a `qsim proxy`, or any OpenAI-compatible
    /// server), e.g. http://127.0.0.1:8080.
    pub target: String,
    /// The scenario to play (needed when the file has several).
    pub scenario: Option<String>,
    /// Compressed time: the scenario runs X times faster than real time (in
    /// (0, 100]; virtual time = real elapsed × X). Run the proxy with the same
    /// `--time-scale`: its limiter's clock and retry hints are then in the same time.
    pub time_scale: f64,
    /// At most this many HTTP attempts in all.
    pub max_requests: u64,
    /// Real-time limit of one attempt; rows still running this long after
    /// the scenario's end are abandoned (counted as unanswered).
    pub timeout: qsim_sim::time::Nanos,
    /// Output format: table, json, or csv (the tidy records).
    pub format: Format,
    /// Also simulate the scenario (`qsim plan`'s driver, same seed) and show
    /// the plan's admitted counts per consumer per minute beside the observed.
    pub compare_with_sim: bool,
    /// With --compare-with-sim: also simulate this many seeds (seed, seed+1,
    /// …) and show the plan's median and 90 % interval of each consumer's
    /// admitted count per saturated minute (which consumer wins a unit of the
    /// shared pool is a race: one seed is one draw of it).
    pub sim_seeds: u64,
    /// Seed of the scenario's random streams (arrivals, lengths, jitter).
    pub seed: u64,
    /// A consumer's key, NAME=KEY (repeatable); default `key-NAME`, as
    /// `qsim plan --emit-proxy-config` writes them.
    pub keys: Vec<String>,
    /// Send the key in this header instead of `Authorization: Bearer`.
    pub consumer_header: Option<String>,
    /// Request path.
    pub path: String,
    /// The requests' `model` field.
    pub model: String,
    /// Send each prompt as LO..HI token ids (`{"prompt": [ids…]}`, for
    /// `--path /v1/completions` of an engine such as llama.cpp's or vLLM's
    /// server) instead of a chat message: the engine then computes exactly
    /// the drawn input length, and each row's ids are its own seeded draw,
    /// so no prefix cache serves a prompt (as `qsim calibrate bench`).
    pub token_ids: Option<String>,
    /// Worker threads of the load generator (default: one per core).
    pub threads: Option<u16>,
    /// Write the report to this file (atomically) instead of stdout.
    pub out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    pub force: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            file: PathBuf::from("builtin:experiments/shared-deployment.toml"),
            target: String::new(),
            scenario: None,
            time_scale: 1.0,
            max_requests: 1_000_000,
            timeout: 60_000_000_000,
            format: Format::Table,
            compare_with_sim: false,
            sim_seeds: 1,
            seed: 1,
            keys: Vec::new(),
            consumer_header: None,
            path: "/v1/chat/completions".into(),
            model: "qsim-load".into(),
            token_ids: None,
            threads: None,
            out: None,
            force: false,
        }
    }
}

fn flag_err(flag: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(flag, "", reason)
}

/// The scenario file with exactly one scenario left (the chosen one).
pub fn scenario_file(args: &Spec) -> Result<(SharedFile, qsim_sim::plan::Model), ConfigError> {
    let plan = PlanSpec {
        scenarios: Some(args.file.clone()),
        only: args.scenario.iter().cloned().collect(),
        seed: args.seed,
        ..Default::default()
    };
    let (f, model) = qsim_sim::plan::build(&plan)?;
    if f.scenarios.len() != 1 {
        let names: Vec<&str> = f.scenarios.iter().map(|s| s.name.as_str()).collect();
        return Err(flag_err(
            "--scenario",
            format!(
                "{} has {} scenarios ({}): choose one",
                f.source,
                names.len(),
                names.join(", ")
            ),
        ));
    }
    Ok((f, model))
}

/// The open-loop arrivals and closed-loop workers of the file's (only)
/// scenario: the arrivals are the simulator's
/// ([`qsim_sim::plan::sim::open_arrivals`], the rule its event loop runs).
pub fn compile(f: &SharedFile, seed: u64) -> (Vec<Arrival>, Vec<Worker>) {
    let sc = &f.scenarios[0];
    let arrivals = sim::open_arrivals(f, 0, seed)
        .into_iter()
        .map(|a| Arrival {
            at: a.at,
            consumer: a.consumer,
            load: a.load,
            input_tokens: a.tokens.map(|t| t.0),
        })
        .collect();
    let mut workers = Vec::new();
    for (li, l) in sc.loads.iter().enumerate() {
        if let PlanArrival::Closed { workers: w, think } = l.arrival {
            for c in f.resolve(&l.who) {
                for _ in 0..w {
                    workers.push(Worker {
                        consumer: c as u32,
                        load: li as u32,
                        start: l.start,
                        stop: l.stop,
                        think,
                    });
                }
            }
        }
    }
    (arrivals, workers)
}

/// The scenario's other streams, as `plan::sim` derives them: token
/// lengths per consumer (`WORKLOAD`; an input and an output length per row,
/// the output drawn and unused: the endpoint decides it) and the client's
/// jitter (`CLIENT`).
struct SimDraws {
    tokens: Vec<Rng>,
    client: Rng,
    file: SharedFile,
}

impl Draws for SimDraws {
    fn input_tokens(&mut self, consumer: usize) -> u32 {
        sim::draw_lengths(&self.file, &mut self.tokens[consumer]).0
    }
    fn unit(&mut self) -> f64 {
        unit(&mut self.client)
    }
}

fn sim_draws(f: &SharedFile, seed: u64) -> SimDraws {
    let sc = &f.scenarios[0];
    SimDraws {
        tokens: (0..f.limiter.consumers.len())
            .map(|c| sim::token_stream(seed, sc, c))
            .collect(),
        client: sim::client_stream(seed, sc),
        file: f.clone(),
    }
}

fn identities(f: &SharedFile, args: &Spec) -> Result<Vec<Identity>, ConfigError> {
    let mut ids: Vec<Identity> = f
        .limiter
        .consumers
        .iter()
        .map(|c| Identity {
            name: c.name.clone(),
            header: args.consumer_header.clone(),
            key: format!("key-{}", c.name),
        })
        .collect();
    for k in &args.keys {
        let (n, key) = k
            .split_once('=')
            .ok_or_else(|| flag_err("--key", "expected NAME=KEY"))?;
        let id = ids.iter_mut().find(|i| i.name == n.trim()).ok_or_else(|| {
            flag_err(
                "--key",
                format!("no consumer named {:?} in the scenario file", n.trim()),
            )
        })?;
        if key.trim().is_empty() {
            return Err(flag_err("--key", format!("empty key for {}", id.name)));
        }
        id.key = key.trim().to_string();
    }
    if let Some(h) = &args.consumer_header {
        if h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(flag_err(
                "--consumer-header",
                format!("not a header name: {h:?}"),
            ));
        }
    }
    Ok(ids)
}

/// The live driver plays each load's retry policy and SDK layer through
/// the core's `Call`, but keeps no configured state shared by a consumer's
/// callers: a scenario with a retry quota or an adaptive throttle is refused
/// rather than played without them.
fn unshared_layers(f: &SharedFile) -> Result<(), ConfigError> {
    let sc = &f.scenarios[0];
    match sc
        .loads
        .iter()
        .position(|l| l.shared != PoolShared::default())
    {
        None => Ok(()),
        Some(li) => Err(ConfigError::new(
            &f.source,
            format!("scenario.{}.load.{li}", sc.index),
            "qsim load does not play a retry quota or an adaptive throttle yet; \
             remove retry_quota and throttle (or the policy that sets them) to play this scenario",
        )),
    }
}

/// Everything checked before any request leaves.
pub struct Prepared {
    pub file: SharedFile,
    pub model: qsim_sim::plan::Model,
    pub config: LoadConfig,
}

pub fn prepare(args: &Spec) -> Result<Prepared, ConfigError> {
    if !(args.time_scale > 0.0 && args.time_scale <= 100.0) {
        return Err(flag_err(
            "--time-scale",
            format!("must be in (0, 100], got {}", args.time_scale),
        ));
    }
    let target = args.target.trim_end_matches('/').to_string();
    let valid = target
        .strip_prefix("http://")
        .is_some_and(|r| !r.is_empty())
        && target.parse::<qsim_live::Uri>().is_ok();
    if !valid {
        return Err(flag_err(
            "--target",
            format!("expected http://host:port, got {:?}", args.target),
        ));
    }
    if !args.path.starts_with('/') {
        return Err(flag_err("--path", "must start with /"));
    }
    let prompt_ids = match &args.token_ids {
        None => None,
        Some(s) => {
            let ids = qsim_sim::workload::bench::range("--token-ids", s)?;
            let seed = args.seed;
            Some(qsim_live::load::PromptIds(std::sync::Arc::new(
                move |row: u64, n: u32| {
                    qsim_sim::workload::bench::prompt(seed, ids, row as usize, n)
                },
            )))
        }
    };
    let (file, model) = scenario_file(args)?;
    unshared_layers(&file)?;
    let consumers = identities(&file, args)?;
    let (arrivals, workers) = compile(&file, args.seed);
    let sc = &file.scenarios[0];
    let units = match file.limiter.unit {
        Unit::Rpm => Units::Requests,
        Unit::Tpm => Units::Tokens(file.limiter.accounting),
    };
    let config = LoadConfig {
        target,
        path: args.path.clone(),
        model: args.model.clone(),
        max_tokens: file.max_tokens,
        consumers,
        policies: sc.loads.iter().map(|l| l.caller.clone()).collect(),
        arrivals,
        workers,
        duration: sc.duration,
        time_scale: args.time_scale,
        max_requests: args.max_requests,
        timeout: Duration::from_nanos(args.timeout),
        units,
        threads: args.threads.map(usize::from),
        prompt_ids,
    };
    Ok(Prepared {
        file,
        model,
        config,
    })
}

/// The observed run as the plan's records (subjects `scenario` and
/// `scenario/consumer`, the metric names of `plan::seeds::records`), plus
/// the live-only counts (`limited`, `unanswered`, `other_status`, `rows`).
pub fn records(out: &mut Records, seed: u64, scenario: &str, duration: Nanos, r: &LoadReport) {
    let sat = r.saturated(duration);
    let sat: Vec<usize> = (0..sat.len()).filter(|&m| sat[m]).collect();
    out.push(seed, scenario, "saturated_minutes", sat.len() as f64);
    out.push(seed, scenario, "attempts", r.attempts as f64);
    out.push(seed, scenario, "abandoned", r.abandoned as f64);
    out.push(
        seed,
        scenario,
        "cut_by_max_requests",
        r.cut_by_max_requests as f64,
    );
    out.push(seed, scenario, "wall_s", r.wall.as_secs_f64());
    out.push(seed, scenario, "time_scale", r.time_scale);
    out.push(seed, scenario, "send_lag_mean_s", r.lag_mean as f64 / 1e9);
    out.push(seed, scenario, "send_lag_max_s", r.lag_max as f64 / 1e9);
    out.push(seed, scenario, "sends_over_1s_late", r.lag_over_1s as f64);
    let e2e = r.e2e_ok_s();
    if !e2e.is_empty() {
        // the plan's metric: E2E of the admitted requests (here from the
        // client's send to the answer's last byte, virtual time)
        out.push(seed, scenario, "e2e_p50_s", quantile(&e2e, 0.5));
    }
    for co in &r.consumers {
        let s = consumer_subject(scenario, &co.name);
        out.push(seed, &s, "offered", co.offered as f64);
        out.push(seed, &s, "admitted", co.admitted as f64);
        out.push(seed, &s, "failed", co.failed as f64);
        if co.offered > 0 {
            let pct = 100.0 * co.admitted as f64 / co.offered as f64;
            out.push(seed, &s, "success_pct", pct);
        }
        if !sat.is_empty() {
            let sum: u64 = sat.iter().map(|&m| co.admitted_units_per_min[m]).sum();
            out.push(
                seed,
                &s,
                "admitted_per_saturated_min",
                sum as f64 / sat.len() as f64,
            );
        }
        out.push(seed, &s, "rows", co.rows as f64);
        out.push(seed, &s, "limited", co.limited as f64);
        out.push(seed, &s, "upstream_limited", co.upstream_limited as f64);
        out.push(seed, &s, "unanswered", co.unanswered as f64);
        let other: u64 = co.other_status.iter().map(|(_, n)| n).sum();
        out.push(seed, &s, "other_status", other as f64);
        for m in 0..co.admitted_per_min.len() {
            let a = co.admitted_units_per_min[m] as f64;
            out.push(seed, &s, &format!("admitted_per_min.{m}"), a);
            let f = co.offered_units_per_min[m] as f64;
            out.push(seed, &s, &format!("offered_per_min.{m}"), f);
        }
    }
}

fn value(recs: &Records, subject: &str, metric: &str) -> Option<f64> {
    recs.iter()
        .find(|r| r.subject == subject && r.metric == metric)
        .map(|r| r.value)
}

/// The plan's prediction for the same scenario: the records of `seed` (and
/// of the following seeds with `--sim-seeds`).
pub struct Predicted {
    /// Records of `seed` only.
    pub records: Records,
    /// Records of every simulated seed.
    pub all: Records,
    pub seeds: u64,
    /// The saturated minutes of `seed`.
    pub saturated: Vec<bool>,
}

/// Under the default work budget: refused up front on the estimate, or
/// stopped by the run-time meter (exit 2 before any request is sent).
pub fn simulate(p: &Prepared, seed: u64, seeds: u64) -> Result<Predicted, ConfigError> {
    let budget = qsim_sim::budget::Budget::default();
    qsim_sim::plan::budget::simulate(&p.file, &p.model)?
        .times(seeds as f64, "seeds")
        .check(&p.file.source, &budget)?;
    let ((runs, records, all), meter) = qsim_sim::work::scope(budget.max_requests, || {
        let runs = qsim_sim::plan::simulate(&p.file, &p.model, seed, false);
        let mut records = Records::default();
        qsim_sim::plan::seeds::records(&mut records, seed, &runs);
        let mut all = records.clone();
        for k in 1..seeds {
            let s = seed.wrapping_add(k);
            qsim_sim::plan::seeds::records(
                &mut all,
                s,
                &qsim_sim::plan::simulate(&p.file, &p.model, s, false),
            );
        }
        (runs, records, all)
    });
    if meter.over() {
        // qsim load's own --max-requests bounds HTTP attempts, not this
        return Err(qsim_sim::work::exceeded_advising(
            &p.file.source,
            &meter,
            "--compare-with-sim simulates under the default budget: drop it, or shorten the scenario",
        ));
    }
    Ok(Predicted {
        saturated: runs[0].limited.saturated.clone(),
        records,
        all,
        seeds,
    })
}

/// The plan's figure for the seed, its spread over seeds, the observed.
type PerSat = (f64, qsim_sim::report::Spread, f64);

/// Per consumer: (plan's admitted per saturated minute for the seed, its
/// median and 90 % interval over the simulated seeds, the observed mean
/// over the plan's saturated minutes); `None` without a saturated minute.
fn per_saturated_minute(
    p: &Prepared,
    sim: &Predicted,
    obs: &Records,
) -> Vec<(String, Option<PerSat>)> {
    let sc = &p.file.scenarios[0].name;
    let spreads = sim.all.spreads();
    let sat: Vec<usize> = (0..sim.saturated.len())
        .filter(|&m| sim.saturated[m])
        .collect();
    p.file
        .limiter
        .consumers
        .iter()
        .map(|c| {
            let sub = consumer_subject(sc, &c.name);
            let key = "admitted_per_saturated_min";
            let v = (!sat.is_empty() && spreads.has(&sub, key)).then(|| {
                let seed_v = value(&sim.records, &sub, key).unwrap_or(f64::NAN);
                let ob = sat
                    .iter()
                    .map(|&m| per_minute(p, obs, &c.name, m))
                    .sum::<f64>()
                    / sat.len() as f64;
                (seed_v, spreads.get(&sub, key), ob)
            });
            (c.name.clone(), v)
        })
        .collect()
}

fn unit_name(f: &SharedFile) -> &'static str {
    match f.limiter.unit {
        Unit::Rpm => "requests",
        Unit::Tpm => "tokens",
    }
}

/// The report: table, JSON, or the tidy records as CSV (with
/// `--compare-with-sim`, a `source` column: observed or plan).
pub fn render(p: &Prepared, args: &Spec, r: &LoadReport, sim: Option<&Predicted>) -> String {
    let sc = &p.file.scenarios[0];
    let mut obs = Records::default();
    records(&mut obs, args.seed, &sc.name, sc.duration, r);
    match args.format {
        Format::Csv => {
            let mut points = vec![PointRecords {
                params: vec![("source".into(), "observed".into())],
                records: obs,
            }];
            if let Some(s) = sim {
                points.push(PointRecords {
                    params: vec![("source".into(), "plan".into())],
                    records: s.all.clone(),
                });
            }
            qsim_sim::report::records::to_csv(&points)
        }
        Format::Json => qsim_sim::report::json_text(&json_report(p, args, r, &obs, sim)),
        Format::Table => table(p, args, r, &obs, sim),
    }
}

fn per_minute(p: &Prepared, recs: &Records, consumer: &str, m: usize) -> f64 {
    let s = consumer_subject(&p.file.scenarios[0].name, consumer);
    value(recs, &s, &format!("admitted_per_min.{m}")).unwrap_or(0.0)
}

fn json_report(
    p: &Prepared,
    args: &Spec,
    r: &LoadReport,
    obs: &Records,
    sim: Option<&Predicted>,
) -> Value {
    let sc = &p.file.scenarios[0];
    let consumers: Vec<Value> = r
        .consumers
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "rows": c.rows,
                "offered": c.offered,
                "admitted": c.admitted,
                "limited": c.limited,
                "upstream_limited": c.upstream_limited,
                "other_status": c.other_status.iter().map(|(s, n)| json!({"status": s, "count": n})).collect::<Vec<_>>(),
                "unanswered": c.unanswered,
                "failed": c.failed,
                "admitted_per_min": c.admitted_units_per_min,
                "offered_per_min": c.offered_units_per_min,
            })
        })
        .collect();
    let mut v = json!({
        "scenario": sc.name,
        "file": p.file.source,
        "target": p.config.target,
        "seed": args.seed,
        "time_scale": r.time_scale,
        "unit": unit_name(&p.file),
        "wall_s": qsim_sim::report::round(r.wall.as_secs_f64(), 3),
        "attempts": r.attempts,
        "abandoned": r.abandoned,
        "cut_by_max_requests": r.cut_by_max_requests,
        "send_lag_mean_s": qsim_sim::report::round(r.lag_mean as f64 / 1e9, 4),
        "send_lag_max_s": qsim_sim::report::round(r.lag_max as f64 / 1e9, 4),
        "sends_over_1s_late": r.lag_over_1s,
        "saturated": r.saturated(sc.duration),
        "consumers": consumers,
    });
    let e2e = r.e2e_ok_s();
    if !e2e.is_empty() {
        v["e2e_ok"] = json!({
            "count": e2e.len(),
            "p50_s": qsim_sim::report::round(quantile(&e2e, 0.5), 4),
            "p90_s": qsim_sim::report::round(quantile(&e2e, 0.9), 4),
            "mean_s": qsim_sim::report::round(e2e.iter().sum::<f64>() / e2e.len() as f64, 4),
        });
    }
    if let Some(s) = sim {
        let mut rows = Vec::new();
        for c in &r.consumers {
            for m in 0..r.minutes {
                let pr = per_minute(p, &s.records, &c.name, m);
                let ob = per_minute(p, obs, &c.name, m);
                rows.push(json!({
                    "consumer": c.name,
                    "minute": m,
                    "saturated": s.saturated.get(m).copied().unwrap_or(false),
                    "plan": pr,
                    "observed": ob,
                    "difference": ob - pr,
                }));
            }
        }
        v["plan_saturated"] = json!(s.saturated);
        v["compare"] = Value::Array(rows);
        let r3 = |x: f64| qsim_sim::report::round(x, 3);
        let per_sat: Vec<Value> = per_saturated_minute(p, s, obs)
            .into_iter()
            .filter_map(|(c, v)| {
                v.map(|(seed_v, sp, ob)| {
                    json!({
                        "consumer": c,
                        "plan": r3(seed_v),
                        "plan_median": r3(sp.median),
                        "plan_interval90": [r3(sp.lo), r3(sp.hi)],
                        "plan_seeds": s.seeds,
                        "observed": r3(ob),
                    })
                })
            })
            .collect();
        v["admitted_per_saturated_min"] = Value::Array(per_sat);
        if let Some((seed_v, sp)) = plan_e2e_p50(p, s) {
            v["plan_e2e_p50_s"] = json!({
                "plan": qsim_sim::report::round(seed_v, 4),
                "plan_median": qsim_sim::report::round(sp.median, 4),
                "plan_interval90": [qsim_sim::report::round(sp.lo, 4), qsim_sim::report::round(sp.hi, 4)],
                "plan_seeds": s.seeds,
            });
        }
    }
    v
}

/// A warning when the upstream's 429s (those without a qsim proxy's
/// [`qsim_live::LIMITED_BY`] mark) outnumber the proxy's own and are at
/// least 1 % of the attempts: the comparison with the plan then measures
/// the upstream's limits, not the proxy's policy.
pub fn upstream_warning(r: &LoadReport) -> Option<String> {
    let all: u64 = r.consumers.iter().map(|c| c.limited).sum();
    let up: u64 = r.consumers.iter().map(|c| c.upstream_limited).sum();
    (up > all - up && up * 100 >= r.attempts && up > 0).then(|| {
        format!(
            "\nwarning: {up} of the {all} 429s came from the upstream, not from a qsim proxy's \
             limiter (no {} header): the upstream limits below the plan's capacity, so the \
             admitted counts below measure the upstream, not the proxy's policy\n",
            qsim_live::LIMITED_BY
        )
    })
}

/// The plan's E2E p50 of admitted requests: for the seed, and its spread
/// over the simulated seeds.
fn plan_e2e_p50(p: &Prepared, sim: &Predicted) -> Option<(f64, qsim_sim::report::Spread)> {
    let sc = &p.file.scenarios[0].name;
    let spreads = sim.all.spreads();
    spreads.has(sc, "e2e_p50_s").then(|| {
        (
            value(&sim.records, sc, "e2e_p50_s").unwrap_or(f64::NAN),
            spreads.get(sc, "e2e_p50_s"),
        )
    })
}

fn table(
    p: &Prepared,
    args: &Spec,
    r: &LoadReport,
    obs: &Records,
    sim: Option<&Predicted>,
) -> String {
    let sc = &p.file.scenarios[0];
    let mut out = format!(
        "qsim load: scenario {} of {} against {} (seed {}, time scale {}x: {:.1} s of scenario in {:.1} s)\n",
        sc.name,
        p.file.source,
        p.config.target,
        args.seed,
        r.time_scale,
        sc.duration as f64 / 1e9,
        r.wall.as_secs_f64()
    );
    out.push_str(&format!(
        "{} attempts; {} rows abandoned at the end; {} rows cut by --max-requests\n\
         sends behind schedule (virtual): mean {:.3} s, max {:.3} s, {} over 1 s late \
         (attempts are counted in the minute they were due)\n\n",
        r.attempts,
        r.abandoned,
        r.cut_by_max_requests,
        r.lag_mean as f64 / 1e9,
        r.lag_max as f64 / 1e9,
        r.lag_over_1s
    ));
    let mut t = Table::new([
        "consumer",
        "rows",
        "attempts",
        "admitted (2xx)",
        "429 by proxy",
        "429 upstream",
        "other status",
        "unanswered",
        "failed rows",
        "success %",
    ]);
    for c in &r.consumers {
        let other: Vec<String> = c
            .other_status
            .iter()
            .map(|(s, n)| format!("{n}×{s}"))
            .collect();
        t.row([
            c.name.clone(),
            c.rows.to_string(),
            c.offered.to_string(),
            c.admitted.to_string(),
            (c.limited - c.upstream_limited).to_string(),
            c.upstream_limited.to_string(),
            if other.is_empty() {
                "0".into()
            } else {
                other.join(" ")
            },
            c.unanswered.to_string(),
            c.failed.to_string(),
            if c.offered > 0 {
                format!("{:.1}", 100.0 * c.admitted as f64 / c.offered as f64)
            } else {
                "–".into()
            },
        ]);
    }
    out.push_str(&t.render());
    if let Some(w) = upstream_warning(r) {
        out.push_str(&w);
    }
    let e2e = r.e2e_ok_s();
    if !e2e.is_empty() {
        out.push_str(&format!(
            "\nE2E of the {} attempts answered 2xx (send to last byte, virtual): p50 {:.3} s, p90 {:.3} s, mean {:.3} s\n",
            e2e.len(),
            quantile(&e2e, 0.5),
            quantile(&e2e, 0.9),
            e2e.iter().sum::<f64>() / e2e.len() as f64
        ));
        if let Some((seed_v, sp)) = sim.and_then(|s| plan_e2e_p50(p, s)) {
            let ob = quantile(&e2e, 0.5);
            out.push_str(&format!(
                "plan's E2E p50 of admitted requests: {seed_v:.3} s (seed {}), {:.3} s [{:.3}, {:.3}] over {} seeds; observed {ob:.3} s ({:+.1} %)\n",
                args.seed,
                sp.median,
                sp.lo,
                sp.hi,
                sim.map_or(0, |s| s.seeds),
                100.0 * (ob / sp.median - 1.0)
            ));
        }
    }
    let saturated = r.saturated(sc.duration);
    match sim {
        None => {
            out.push_str(&format!(
                "\nadmitted {} per minute (virtual; * = every second limited)\n",
                unit_name(&p.file)
            ));
            let mut t = Table::new(
                std::iter::once("minute".to_string())
                    .chain(r.consumers.iter().map(|c| c.name.clone())),
            );
            for m in 0..r.minutes {
                let mark = if saturated.get(m).copied().unwrap_or(false) {
                    "*"
                } else {
                    ""
                };
                t.row(
                    std::iter::once(format!("{m}{mark}")).chain(
                        r.consumers
                            .iter()
                            .map(|c| format!("{:.0}", per_minute(p, obs, &c.name, m))),
                    ),
                );
            }
            out.push_str(&t.render());
        }
        Some(s) => {
            out.push_str(&format!(
                "\nadmitted {} per minute: plan (simulation, same seed) vs observed \
                 (* = saturated minute in the plan)\n",
                unit_name(&p.file)
            ));
            let mut t = Table::new([
                "consumer",
                "minute",
                "plan",
                "observed",
                "difference",
                "difference %",
            ]);
            for c in &r.consumers {
                for m in 0..r.minutes {
                    let pr = per_minute(p, &s.records, &c.name, m);
                    let ob = per_minute(p, obs, &c.name, m);
                    let mark = if s.saturated.get(m).copied().unwrap_or(false) {
                        "*"
                    } else {
                        ""
                    };
                    t.row([
                        c.name.clone(),
                        format!("{m}{mark}"),
                        format!("{pr:.0}"),
                        format!("{ob:.0}"),
                        format!("{:+.0}", ob - pr),
                        if pr > 0.0 {
                            format!("{:+.1}", 100.0 * (ob - pr) / pr)
                        } else {
                            "–".into()
                        },
                    ]);
                }
            }
            out.push_str(&t.render());
            let rows = per_saturated_minute(p, s, obs);
            if rows.iter().any(|(_, v)| v.is_some()) {
                out.push_str(&format!(
                    "\nadmitted {} per saturated minute (the plan's saturated minutes): plan (seed {}), \
                     plan over {} seeds: median [90% interval], observed\n",
                    unit_name(&p.file),
                    args.seed,
                    s.seeds
                ));
                let mut t = Table::new([
                    "consumer",
                    "plan",
                    "plan over seeds",
                    "observed",
                    "difference %",
                ]);
                for (c, v) in rows {
                    if let Some((seed_v, sp, ob)) = v {
                        t.row([
                            c,
                            format!("{seed_v:.1}"),
                            format!("{:.1} [{:.1}, {:.1}]", sp.median, sp.lo, sp.hi),
                            format!("{ob:.1}"),
                            if sp.median > 0.0 {
                                format!("{:+.1}", 100.0 * (ob - sp.median) / sp.median)
                            } else {
                                "–".into()
                            },
                        ]);
                    }
                }
                out.push_str(&t.render());
            }
        }
    }
    out
}

/// `qsim load`: check everything, optionally simulate, play, render.
/// Play the scenario against the target (and simulate it beside, with
/// `compare_with_sim`): the report rendered in the spec's format.
///
/// ```no_run
/// let text = qsim_api::load::run(&qsim_api::load::Spec {
///     target: "http://127.0.0.1:8080".into(),
///     scenario: Some("mild".into()),
///     time_scale: 20.0,
///     ..Default::default()
/// })
/// .unwrap();
/// print!("{text}");
/// ```
pub fn run(spec: &Spec) -> Result<String, crate::Error> {
    let p = prepare(spec)?;
    let sim = if spec.compare_with_sim {
        Some(simulate(&p, spec.seed, spec.sim_seeds)?)
    } else {
        None
    };
    let draws = Box::new(sim_draws(&p.file, spec.seed));
    let report = qsim_live::load::run(p.config.clone(), draws).map_err(crate::Error::Io)?;
    Ok(render(&p, spec, &report, sim.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsim_sim::time::NS_PER_SEC;

    const MINUTE: Nanos = 60 * NS_PER_SEC;

    fn args(scenario: &str) -> Spec {
        Spec {
            file: PathBuf::from("builtin:experiments/shared-deployment.toml"),
            target: "http://127.0.0.1:9".into(),
            scenario: Some(scenario.into()),
            time_scale: 1.0,
            max_requests: 1_000_000,
            timeout: 60 * qsim_sim::time::NS_PER_SEC,
            format: Format::Table,
            compare_with_sim: false,
            sim_seeds: 1,
            seed: 1,
            keys: vec![],
            consumer_header: None,
            path: "/v1/chat/completions".into(),
            model: "m".into(),
            token_ids: None,
            threads: None,
            out: None,
            force: false,
        }
    }

    /// `--token-ids`: each row's prompt is `n` ids in the range, the same
    /// for the seed, and no two rows share a first id run (no prefix).
    #[test]
    fn token_id_prompts_are_per_row_seeded_draws_in_range() {
        let mut a = args("heavy");
        a.token_ids = Some("300..31999".into());
        let p = prepare(&a).unwrap();
        let ids = p.config.prompt_ids.clone().unwrap();
        let again = prepare(&a).unwrap().config.prompt_ids.unwrap();
        for row in [0u64, 1, 77, (3 << 32) + 5] {
            let v = (ids.0)(row, 116);
            assert_eq!(v.len(), 116);
            assert!(v.iter().all(|&x| (300..=31999).contains(&x)), "{v:?}");
            assert_eq!(v, (again.0)(row, 116));
            assert_ne!(v[..4], (ids.0)(row + 1, 116)[..4]);
        }
        assert!(prepare(&args("heavy")).unwrap().config.prompt_ids.is_none());
    }

    /// The compiled arrivals are the simulator's: per consumer per minute,
    /// as many as the plan offers (no retries in these scenarios, so every
    /// offered attempt is an arrival).
    #[test]
    fn arrivals_are_the_simulators() {
        for name in [
            "normal",
            "mild",
            "heavy",
            "extreme",
            "late-joiner",
            "reserved-only",
        ] {
            let p = prepare(&args(name)).unwrap();
            let runs = qsim_sim::plan::simulate(&p.file, &qsim_sim::plan::Model::Ideal, 1, false);
            let o = &runs[0].limited;
            for (c, co) in o.consumers.iter().enumerate() {
                let mut per_min = vec![0u64; o.minutes()];
                for a in p
                    .config
                    .arrivals
                    .iter()
                    .filter(|a| a.consumer as usize == c)
                {
                    per_min[(a.at / MINUTE) as usize] += 1;
                }
                assert_eq!(per_min, co.offered_per_min, "{name}/{}", co.name);
            }
        }
    }

    /// A trace load's rows are compiled at their times with their input
    /// lengths, to the consumers the simulator sends them to.
    #[test]
    fn trace_rows_are_compiled_with_their_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let mut csv = String::from("t,who,inp,out\n");
        for k in 0..50u32 {
            csv += &format!(
                "{},{},{},{}\n",
                k * 2,
                ["a", "b"][(k % 2) as usize],
                5 + k,
                7
            );
        }
        std::fs::write(dir.path().join("t.csv"), csv).unwrap();
        let path = dir.path().join("s.toml");
        let text = "kind = \"shared\"\nmax_tokens = 64\n\
             input_tokens = { dist = \"const\", value = 1000 }\n\
             output_tokens = { dist = \"const\", value = 10 }\n\
             [deployment]\ncapacity = 1000\n[[consumer]]\nname = \"a\"\n[[consumer]]\nname = \"b\"\n\
             [[scenario]]\nname = \"s\"\nduration_s = 90\n\
             [[scenario.load]]\nwho = \"all\"\nstart_s = 5\n\
             trace = { file = \"t.csv\", format = \"csv\", time_column = \"t\", \
             input_column = \"inp\", output_column = \"out\", consumer_column = \"who\" }\n";
        let file = path.display().to_string();
        let f = SharedFile::from_value(&file, toml::from_str(text).unwrap()).unwrap();
        let (arrivals, workers) = compile(&f, 1);
        assert!(workers.is_empty());
        // rows at 0, 2, …, 98 s from 5 s: those before 90 s, i.e. k < 43
        assert_eq!(arrivals.len(), 43);
        for (k, a) in arrivals.iter().enumerate() {
            let k = k as u64;
            assert_eq!(a.at, (5 + 2 * k) * qsim_sim::time::NS_PER_SEC);
            assert_eq!(a.consumer as u64, k % 2);
            assert_eq!(a.input_tokens, Some(5 + k as u32));
        }
        let runs = qsim_sim::plan::simulate(&f, &qsim_sim::plan::Model::Ideal, 1, false);
        let offered: u64 = runs[0].limited.consumers.iter().map(|c| c.offered).sum();
        assert_eq!(offered, 43);
    }

    /// A throttle or retry quota the live driver cannot play is refused,
    /// naming the load; the SDK layer and own retries are played.
    #[test]
    fn shared_caller_state_is_refused_sdk_retries_are_played() {
        let file = |load: &str| {
            let text = format!(
                "kind = \"shared\"\nmax_tokens = 64\nsdk_retries = true\n\
                 input_tokens = {{ dist = \"const\", value = 10 }}\n\
                 output_tokens = {{ dist = \"const\", value = 10 }}\n\
                 [deployment]\ncapacity = 10\n[[consumer]]\nname = \"a\"\n\
                 [[scenario]]\nname = \"s\"\nduration_s = 60\n\
                 [[scenario.load]]\nwho = \"a\"\nrpm = 5\n{load}"
            );
            SharedFile::from_value("t.toml", toml::from_str(&text).unwrap()).unwrap()
        };
        let f = file("retry = { backoff = \"constant\" }");
        assert!(unshared_layers(&f).is_ok());
        assert!(f.scenarios[0].loads[0].caller.sdk.is_some());
        let e = unshared_layers(&file("throttle = { k = 2 }"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("scenario.0.load.0") && e.contains("throttle"),
            "{e}"
        );
        assert!(unshared_layers(&file("retry_quota = { capacity = 5 }")).is_err());
    }

    fn err(a: &Spec) -> String {
        match prepare(a) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let mut a = args("heavy");
        a.time_scale = 0.0;
        assert!(err(&a).contains("--time-scale"));
        let mut a = args("heavy");
        a.target = "https://x".into();
        assert!(err(&a).contains("--target"));
        let a = args("nope");
        assert!(err(&a).contains("nope"));
        let mut a = args("heavy");
        a.scenario = None;
        assert!(err(&a).contains("choose one"));
        let mut a = args("heavy");
        a.keys = vec!["Z=k".into()];
        assert!(err(&a).contains("--key"));
    }
}
