//! Plan, then enforce (issue 10's acceptance), on 127.0.0.1 only:
//!
//! `qsim plan --capacity 1000 --reserve 30,20,30 --emit-proxy-config` →
//! `qsim proxy` (that file, time-scaled) in front of `llmock` (PyPI, from the
//! venv that scripts/live-deps.sh installs) → `qsim load` of the
//! shared-deployment article's heavy scenario (all four consumers at 1,800
//! RPM each, 7× capacity, 3 minutes), compressed 10×.
//!
//! Why 5×: the heavy scenario offers 7,200 RPM = 120 requests/s; at 5× the
//! proxy answers 600 requests/s (~515 of them 429s) and forwards capacity =
//! 1,000 RPM = ~83 requests/s to llmock. llmock (one uvicorn process)
//! measured here at ~390 requests/s flat out (p50 4 ms at 200/s, 200 ms at
//! 400/s), so even 10× (167/s upstream) would not saturate it; the limit is
//! the 2-core machine running llmock, the proxy and the load generator
//! (plus whatever else runs): at 10× under a load average of ~14, sends fell
//! up to 3.8 virtual seconds behind schedule and the bunched arrivals
//! reshuffled the unreserved pool (dev +29 in a minute); at 5× the worst lag
//! was 0.1 virtual s. Which consumer wins a pool unit depends on the order
//! of arrivals within milliseconds, so timing fidelity is what the
//! per-minute comparison needs. The scenario's 180 virtual seconds take 36 s.
//!
//! The load generator reports how late its sends left (virtual time): a run
//! in which some send was over 1 virtual second late (the machine stalled
//! the generator; seen here under a load average of ~12 with other builds)
//! is reported and repeated in real time (1×: a fifth of the work per
//! second, three minutes) — the comparison is only meaningful for a replay
//! that kept its schedule — and only a real-time run that cannot keep it
//! either fails the test. No verdict rests on how fast the machine is.
//!
//! Checked:
//! - upstream side (llmock's own request journal, `GET /_llmock/requests`,
//!   its `time.monotonic()` start times — nothing the proxy reports): in
//!   each virtual minute of the scenario the upstream received at most
//!   capacity + burst = 1,200 requests (+1 %); and it served the requests
//!   the load generator saw answered 2xx;
//! - every attempt was answered (2xx or 429 or another status; none
//!   unanswered or abandoned);
//! - every floor (A 300, B 200, C 300 RPM) is met in each saturated minute
//!   (≥ 99 %);
//! - each consumer's admitted count per saturated minute is within 5 % (or
//!   10 requests, or three of the plan's own standard deviations over its
//!   seeds: a live run is one more draw of the same race) of `qsim plan`'s
//!   prediction — its median over 10 seeds of its own metric
//!   `admitted_per_saturated_min` (from its CSV records) —
//!   and the plan figures `qsim load --compare-with-sim` prints are those
//!   records (seed 1 per minute, the median over seeds).

use crate::common::qsim;
use crate::common::{http_json, llmock, Proc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

const SCALE: f64 = 5.0;
/// Seeds of the plan's prediction (its median over them).
const SEEDS: u64 = 10;
/// The most a send may lag behind its schedule (virtual s) for the run to
/// count: beyond it the machine, not the limiter, decided who got the pool.
const MAX_LAG_S: f64 = 1.0;
const CAPACITY: f64 = 1000.0;
const BURST: f64 = 200.0; // (1 - threshold 0.8) × capacity
const FLOORS: [(&str, f64); 3] = [("A", 300.0), ("B", 200.0), ("C", 300.0)];

/// GET a path; the body as JSON.
fn get_json(base: &str, path: &str) -> Value {
    let (status, v) = http_json(base, "GET", path);
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

/// llmock, then `qsim proxy` with the emitted config (time-scaled), then
/// `qsim load` of the heavy scenario beside the plan: (the load's JSON
/// report, llmock's journal, the load's wall time). The processes end with
/// the call.
fn enforce(cfg: &std::path::Path, scale: f64) -> (Value, Value, Duration) {
    let (_up, up_url) = llmock(&[]);
    let child = qsim()
        .args(["proxy", "--allow-placeholder-keys", "--config"])
        .arg(cfg)
        .args(["--listen", "127.0.0.1:0", "--upstream", &up_url])
        .args(["--time-scale", &scale.to_string(), "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qsim proxy");
    let mut proxy = Proc(child);
    let proxy_url = crate::common::proxy_url(&mut proxy);

    let t0 = Instant::now();
    let load = qsim()
        .args(["load", "builtin:experiments/shared-deployment.toml"])
        .args(["--target", &proxy_url, "--scenario", "heavy"])
        .args(["--time-scale", &scale.to_string(), "--threads", "1"])
        .args(["--timeout", "10s", "--max-requests", "40000"])
        .args(["--compare-with-sim", "--sim-seeds", &SEEDS.to_string()])
        .args(["--format", "json"])
        .output()
        .unwrap();
    let wall = t0.elapsed();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&load.stderr));
    let r: Value = serde_json::from_slice(&load.stdout).unwrap();
    eprintln!(
        "sends behind schedule: mean {} s, max {} s, {} over 1 s (virtual); {wall:?}",
        r["send_lag_mean_s"], r["send_lag_max_s"], r["sends_over_1s_late"]
    );
    (r, get_json(&up_url, "/_llmock/requests"), wall)
}

#[test]
fn plan_then_enforce_heavy_scenario() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("proxy.toml");

    // 1. plan: the sized limiter as a proxy config, and the plan's records
    let plan = qsim()
        .args(["plan", "--capacity", "1000", "--reserve", "30,20,30"])
        .args(["--seeds", &SEEDS.to_string()])
        .args(["--format", "csv", "--emit-proxy-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        plan.status.success(),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    // seed 1's per-minute counts, and every seed's admitted count per
    // saturated minute
    let mut predicted: BTreeMap<(String, usize), f64> = BTreeMap::new();
    let mut per_sat: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in String::from_utf8(plan.stdout).unwrap().lines() {
        let f: Vec<&str> = line.split(',').collect();
        if let [seed, subject, metric, value] = f[..] {
            let Some(c) = subject.strip_prefix("heavy/") else {
                continue;
            };
            let v: f64 = value.parse().unwrap();
            if let (Some(m), "1") = (metric.strip_prefix("admitted_per_min."), seed) {
                predicted.insert((c.to_string(), m.parse().unwrap()), v);
            }
            if metric == "admitted_per_saturated_min" {
                per_sat.entry(c.to_string()).or_default().push(v);
            }
        }
    }
    assert_eq!(predicted.len(), 4 * 3, "heavy: 4 consumers × 3 minutes");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (v[(n - 1) / 2] + v[n / 2]) / 2.0
    };
    let plan_median: BTreeMap<String, f64> = per_sat
        .iter()
        .map(|(c, v)| {
            assert_eq!(v.len() as u64, SEEDS, "{c}");
            (c.clone(), median(v))
        })
        .collect();
    assert_eq!(plan_median.len(), 4);
    // the plan's own spread over its seeds (sample standard deviation)
    let plan_sd: BTreeMap<String, f64> = per_sat
        .iter()
        .map(|(c, v)| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            let ss: f64 = v.iter().map(|x| (x - m) * (x - m)).sum();
            (c.clone(), (ss / (v.len() - 1) as f64).sqrt())
        })
        .collect();

    // 2.–3. enforce and load; a run in which the load generator could not
    // keep its schedule (the machine stalled it: sends over MAX_LAG_S late)
    // says nothing about the limiter, so it is reported and repeated once
    let mut scale = SCALE;
    let (r, j, wall) = loop {
        let (r, j, wall) = enforce(&cfg, scale);
        let lag = r["send_lag_max_s"].as_f64().unwrap();
        if lag <= MAX_LAG_S {
            break (r, j, wall);
        }
        assert!(
            scale > 1.0,
            "in real time too the load generator fell up to {lag} virtual s behind schedule \
             (> {MAX_LAG_S} s): this machine cannot run three minutes of 120 requests/s"
        );
        eprintln!(
            "at {scale}x the load generator fell up to {lag} virtual s behind schedule \
             (> {MAX_LAG_S} s, {} sends over 1 s late): repeated in real time",
            r["sends_over_1s_late"]
        );
        scale = 1.0;
    };

    // every attempt answered: none unanswered, abandoned or cut
    assert_eq!(r["abandoned"], 0);
    assert_eq!(r["cut_by_max_requests"], 0);
    let mut ok_total = 0u64;
    let mut other_total = 0u64;
    let mut attempts = 0u64;
    for c in r["consumers"].as_array().unwrap() {
        let n = |k: &str| c[k].as_u64().unwrap();
        let other: u64 = c["other_status"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["count"].as_u64().unwrap())
            .sum();
        assert_eq!(n("unanswered"), 0, "{c}");
        assert_eq!(n("admitted") + n("limited") + other, n("offered"), "{c}");
        if other > 0 {
            eprintln!("{}: other statuses {}", c["name"], c["other_status"]);
        }
        // open loop without retries: one attempt per row
        assert_eq!(n("offered"), n("rows"), "{c}");
        ok_total += n("admitted");
        other_total += other;
        attempts += n("offered");
    }
    assert_eq!(r["attempts"].as_u64().unwrap(), attempts);
    // the article's heavy scenario: ~7,200 RPM for 3 minutes
    assert!((20_000..23_500).contains(&attempts), "{attempts} attempts");

    // the compare rows carry the plan's own records
    let sat: Vec<bool> = r["plan_saturated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    assert_eq!(sat, [false, true, true], "heavy saturates minutes 1 and 2");
    let mut observed: BTreeMap<(String, usize), f64> = BTreeMap::new();
    for row in r["compare"].as_array().unwrap() {
        let key = (
            row["consumer"].as_str().unwrap().to_string(),
            row["minute"].as_u64().unwrap() as usize,
        );
        assert_eq!(row["plan"].as_f64().unwrap(), predicted[&key], "{row}");
        observed.insert(key, row["observed"].as_f64().unwrap());
    }
    assert_eq!(observed.len(), predicted.len());

    // every floor met in every saturated minute; per minute, the plan's
    // seed-1 counts beside the observed (printed: one seed's split of the
    // pool is one draw of a race, see below)
    let mut report = String::new();
    let mut bad = Vec::new();
    for ((c, m), pr) in &predicted {
        let ob = observed[&(c.clone(), *m)];
        let mark = if sat[*m] { "*" } else { " " };
        report.push_str(&format!(
            "{c:>4} minute {m}{mark} plan {pr:>4} observed {ob:>4} ({:+})\n",
            ob - pr
        ));
        if let Some((_, floor)) = FLOORS.iter().find(|(n, _)| n == c) {
            if sat[*m] && ob < 0.99 * floor {
                bad.push(format!("{c} minute {m}: {ob} < floor {floor}"));
            }
        }
    }
    // each consumer's admitted count per saturated minute (the plan's
    // metric admitted_per_saturated_min: the mean over the saturated
    // minutes) within 5 % or 10 requests of the plan's prediction, its median
    // over SEEDS seeds: which consumer wins each unit of the shared pool is
    // decided by the order of arrivals within milliseconds, so one seed's
    // split is one draw (over 30 seeds the plan's per-minute count of dev
    // has a standard deviation of 6, of B 7); a live run is another draw
    let rows = r["admitted_per_saturated_min"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        let c = row["consumer"].as_str().unwrap();
        let pm = plan_median[c];
        assert!(
            (row["plan_median"].as_f64().unwrap() - pm).abs() < 1e-3,
            "qsim load's plan median is qsim plan's: {row} vs {pm}"
        );
        let ob = row["observed"].as_f64().unwrap();
        let tol = (0.05 * pm).max(10.0).max(3.0 * plan_sd[c]);
        report.push_str(&format!(
            "{c:>4} per saturated minute: plan median {pm} observed {ob} ({:+.1})\n",
            ob - pm
        ));
        if (ob - pm).abs() > tol {
            bad.push(format!(
                "{c} per saturated minute: observed {ob}, plan median {pm} (tolerance {tol})"
            ));
        }
    }
    eprint!("{report}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));

    // upstream side: llmock's own journal
    let reqs = j["requests"].as_array().unwrap();
    let mut starts: Vec<f64> = reqs
        .iter()
        .filter(|q| q["path"] == "/v1/chat/completions")
        .map(|q| q["started_at"].as_f64().unwrap())
        .collect();
    starts.sort_by(f64::total_cmp);
    let served = reqs.iter().filter(|q| q["status"] == 200).count() as u64;
    // llmock served what the client saw answered 2xx (plus, at most, the
    // requests whose answer was lost between llmock and the proxy)
    assert!(
        (ok_total..=ok_total + other_total).contains(&served),
        "llmock served {served}, the client saw {ok_total} answered 2xx and {other_total} other"
    );
    // at most capacity + burst (+1 %) in each virtual minute of the
    // scenario, minutes counted from the first request llmock received (the
    // load's t = 0 plus one round trip: the first arrival is admitted at once)
    let minute = 60.0 / scale;
    let mut per_min = [0usize; 4];
    for t in &starts {
        let m = ((t - starts[0]) / minute) as usize;
        per_min[m.min(3)] += 1;
    }
    // the busiest sliding minute, for information: llmock's own stalls on a
    // loaded machine bunch its start times (a request decided before a
    // window may start inside it), so it is not the limiter's bound
    let (mut lo, mut sliding) = (0usize, 0usize);
    for hi in 0..starts.len() {
        while starts[hi] - starts[lo] >= minute {
            lo += 1;
        }
        sliding = sliding.max(hi + 1 - lo);
    }
    eprintln!(
        "upstream: {} requests, per virtual minute {per_min:?} (busiest sliding minute {sliding}); \
         {attempts} attempts in {wall:?}",
        starts.len()
    );
    let worst = per_min[..3].iter().copied().max().unwrap();
    assert!(
        worst as f64 <= (CAPACITY + BURST) * 1.01,
        "upstream received {per_min:?} per virtual minute: over capacity + burst"
    );
    // and the limiter was binding: the upstream got about capacity per minute
    assert!(
        worst as f64 >= CAPACITY,
        "only {worst} in the busiest minute"
    );
}
