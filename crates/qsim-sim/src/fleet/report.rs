//! `qsim fleet`'s reports: text, JSON and the result tables (plain
//! columns; the CLI hands them to qsim-results for Parquet and CSV).

use super::command::{FileRun, Outcome, RouterRun, Search};
use super::optimize::{Answer, Eval, Found, LayoutAnswer, Query};
use super::run::{FleetResult, Latencies};
use crate::engine::DurationHist;
use crate::report::round;
use crate::report::table::Table;
use crate::server::PrefixStats;
use crate::time::to_secs;
use serde_json::{json, Value};

/// A result table's column.
#[derive(Debug, Clone, PartialEq)]
pub enum Col {
    Str(Vec<String>),
    F64(Vec<f64>),
    U64(Vec<u64>),
}

/// A result table: its file stem and named columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Tbl {
    pub name: &'static str,
    pub cols: Vec<(&'static str, Col)>,
}

fn pq(h: &DurationHist, p: f64) -> f64 {
    if h.count() == 0 {
        f64::NAN
    } else {
        h.quantile_s(p)
    }
}

fn s3(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0} s")
    } else if x >= 10.0 {
        format!("{x:.1} s")
    } else {
        format!("{x:.3} s")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(round(x, 6))
    } else {
        Value::Null
    }
}

fn hit_ratio(p: &PrefixStats) -> f64 {
    if p.units == 0 {
        f64::NAN
    } else {
        p.hit_units as f64 / p.units as f64
    }
}

/// The text report.
pub fn text(o: &Outcome) -> String {
    match o {
        Outcome::Run(r) => run_text(r),
        Outcome::Search(s) => search_text(s),
    }
}

/// The JSON report.
pub fn json(o: &Outcome) -> Value {
    match o {
        Outcome::Run(r) => run_json(r),
        Outcome::Search(s) => search_json(s),
    }
}

fn run_text(r: &FileRun) -> String {
    let res = &r.result;
    let mut out = format!(
        "qsim fleet {}: {}, seed {}; {} requests, {} s simulated{}\n\n",
        r.file,
        r.title,
        r.seed,
        res.arrivals,
        crate::time::show(round(to_secs(res.until), 1)),
        if r.warmup > 0 {
            format!(
                " (percentiles of requests arriving after {} s)",
                crate::time::show(to_secs(r.warmup))
            )
        } else {
            String::new()
        }
    );
    let mut t = Table::new([
        "pool",
        "profile",
        "replicas",
        "requests",
        "TTFT p50",
        "TTFT p99",
        "ITL p99",
        "E2E p99",
        "prefix hits",
        "prefill saved",
        "cost $",
    ]);
    let caches = res.pools.iter().any(|p| p.prefix.units > 0);
    for (p, ps) in res.pools.iter().zip(&r.fleet.pools) {
        t.row([
            p.name.clone(),
            ps.profile_label.clone(),
            if ps.autoscale.is_some() {
                format!("≤{}", p.replicas_max)
            } else {
                ps.replicas.to_string()
            },
            p.routed.to_string(),
            s3(pq(&p.lat.ttft, 0.5)),
            s3(pq(&p.lat.ttft, 0.99)),
            s3(pq(&p.metrics.itl, 0.99)),
            s3(pq(&p.lat.e2e, 0.99)),
            if caches { hits(&p.prefix) } else { "-".into() },
            if caches {
                saved(&p.prefix, p.metrics.prefill_tokens)
            } else {
                "-".into()
            },
            format!("{:.2}", p.cost_usd),
        ]);
    }
    let itl = res.itl();
    let all_pref = res.prefix();
    let prefill: u64 = res.pools.iter().map(|p| p.metrics.prefill_tokens).sum();
    t.row([
        "fleet".to_string(),
        String::new(),
        res.pools
            .iter()
            .map(|p| p.replicas_max)
            .sum::<u64>()
            .to_string(),
        (res.arrivals - res.unrouted).to_string(),
        s3(pq(&res.lat.ttft, 0.5)),
        s3(pq(&res.lat.ttft, 0.99)),
        s3(pq(&itl, 0.99)),
        s3(pq(&res.lat.e2e, 0.99)),
        if caches { hits(&all_pref) } else { "-".into() },
        if caches {
            saved(&all_pref, prefill)
        } else {
            "-".into()
        },
        format!("{:.2}", res.cost_usd),
    ]);
    out.push_str(&t.render());
    if res.unrouted > 0 {
        out.push_str(&format!(
            "\n{} requests went nowhere: no pool serves their model or length\n",
            res.unrouted
        ));
    }
    let rejected = res.lat.rejected;
    if rejected > 0 {
        out.push_str(&format!(
            "\n{rejected} requests rejected: longer than their pool's profile serves\n"
        ));
    }
    if caches {
        out.push_str(
            "\nprefix hits: full blocks of the prompt found in the replica's cache, of those offered; prefill saved: prompt tokens not computed, of those that would have been\n",
        );
    }
    out
}

fn hits(p: &PrefixStats) -> String {
    if p.units == 0 {
        "-".into()
    } else {
        format!("{} ({}/{})", pct(hit_ratio(p)), p.hit_units, p.units)
    }
}

fn saved(p: &PrefixStats, prefill: u64) -> String {
    let all = p.saved_tokens + prefill;
    if all == 0 {
        "-".into()
    } else {
        pct(p.saved_tokens as f64 / all as f64)
    }
}

fn lat_json(l: &Latencies, itl: &DurationHist) -> Value {
    json!({
        "completed": l.completed,
        "rejected": l.rejected,
        "ttft_p50_s": num(pq(&l.ttft, 0.5)),
        "ttft_p99_s": num(pq(&l.ttft, 0.99)),
        "itl_p99_s": num(pq(itl, 0.99)),
        "e2e_p50_s": num(pq(&l.e2e, 0.5)),
        "e2e_p99_s": num(pq(&l.e2e, 0.99)),
    })
}

fn prefix_json(p: &PrefixStats, prefill: u64) -> Value {
    json!({
        "units": p.units,
        "hit_units": p.hit_units,
        "hit_ratio": num(hit_ratio(p)),
        "saved_tokens": p.saved_tokens,
        "prefill_tokens": prefill,
    })
}

fn result_json(res: &FleetResult) -> Value {
    let itl = res.itl();
    let prefill: u64 = res.pools.iter().map(|p| p.metrics.prefill_tokens).sum();
    json!({
        "arrivals": res.arrivals,
        "unrouted": res.unrouted,
        "until_s": num(to_secs(res.until)),
        "cost_usd": num(res.cost_usd),
        "latency": lat_json(&res.lat, &itl),
        "prefix": prefix_json(&res.prefix(), prefill),
        "disagg": {
            "remote_prefills": res.disagg.remote,
            "local_prefills": res.disagg.local,
            "kv_bytes": num(res.disagg.kv_bytes),
            "transfers": res.disagg.transfers,
            "transfer_s": num(to_secs(res.disagg.transfer_ns)),
        },
        "pools": res.pools.iter().map(|p| json!({
            "name": p.name,
            "routed": p.routed,
            "replicas_max": p.replicas_max,
            "replica_hours": num(p.replica_ns as f64 / 3.6e12),
            "cost_usd": num(p.cost_usd),
            "unfinished": p.unfinished,
            "preemptions": p.metrics.preemptions,
            "latency": lat_json(&p.lat, &p.metrics.itl),
            "prefix": prefix_json(&p.prefix, p.metrics.prefill_tokens),
        })).collect::<Vec<_>>(),
    })
}

fn run_json(r: &FileRun) -> Value {
    json!({
        "file": r.file,
        "title": r.title,
        "seed": r.seed,
        "warmup_s": num(to_secs(r.warmup)),
        "profiles": r.fleet.pools.iter().map(|p| json!({"pool": p.name, "profile": p.profile_label, "replicas": p.replicas, "replica_hour_usd": num(p.replica_hour_usd)})).collect::<Vec<_>>(),
        "result": result_json(&r.result),
    })
}

fn slo_text(q: &Query) -> String {
    let mut v = Vec::new();
    let s = &q.slo;
    if let Some(t) = s.ttft_p99 {
        v.push(format!("P99 TTFT ≤ {} s", crate::time::show(to_secs(t))));
    }
    if let Some(t) = s.itl_p99 {
        v.push(format!("P99 ITL ≤ {} s", crate::time::show(to_secs(t))));
    }
    if let Some(t) = s.e2e_p99 {
        v.push(format!("P99 E2E ≤ {} s", crate::time::show(to_secs(t))));
    }
    v.join(", ")
}

fn range_text(above: Option<u64>, at_most: Option<u64>) -> String {
    match (above, at_most) {
        (None, None) => "any length".into(),
        (None, Some(b)) => format!("≤ {b} tokens"),
        (Some(a), None) => format!("> {a} tokens"),
        (Some(a), Some(b)) => format!("{a} < tokens ≤ {b}"),
    }
}

fn found_text(f: &Found) -> String {
    match *f {
        Found::Exact(n) => n.to_string(),
        Found::Between(lo, hi) => format!("{}–{hi}, not cheaper", lo + 1),
        Found::Over(n) => format!("> {n}, not cheaper"),
        Found::Never => "never".into(),
    }
}

fn pools_text(q: &Query, l: &LayoutAnswer) -> String {
    l.pools
        .iter()
        .map(|p| match p.choice {
            Some((k, e)) => format!("{}: {} × {}", p.name, e.replicas, q.candidates[k].label),
            None if p.share == 0.0 => format!("{}: no requests", p.name),
            None => format!("{}: none meets", p.name),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What misses with one replica fewer, as a phrase.
fn binds_text(q: &Query, e: Option<&Eval>) -> String {
    match e {
        None => "-".into(),
        Some(e) => {
            let what = e.misses(&q.slo).unwrap_or("nothing");
            let v = match what {
                "TTFT P99" if !e.stopped => format!(" {}", s3(e.ttft_p99)),
                "ITL P99" => format!(" {}", s3(e.itl_p99)),
                "E2E P99" if !e.stopped => format!(" {}", s3(e.e2e_p99)),
                _ if e.stopped => " (over 1 % missed: stopped)".into(),
                _ => String::new(),
            };
            format!("{what}{v} at {}", e.replicas)
        }
    }
}

fn layouts_table(q: &Query, a: &Answer) -> String {
    let mut t = Table::new(["layout", "replicas", "$/hour", "pools"]);
    for (i, l) in a.layouts.iter().enumerate() {
        t.row([
            format!(
                "{}{}",
                l.layout.label(),
                if a.best == Some(i) { " ←" } else { "" }
            ),
            if l.cost_per_hour.is_some() {
                l.replicas().to_string()
            } else {
                "-".into()
            },
            l.cost_per_hour
                .map_or("none meets".into(), |c| format!("{c:.2}")),
            pools_text(q, l),
        ]);
    }
    t.render()
}

fn search_text(s: &Search) -> String {
    let q = &s.query;
    let a = &s.answer;
    let mut out = format!(
        "qsim fleet: {}, {}; seed {}, {} requests per pool per run\ncandidates: {}\n\n",
        s.workload_label,
        slo_text(q),
        q.seed,
        q.requests,
        q.candidates
            .iter()
            .map(|c| format!("{} (${:.2}/replica-hour)", c.label, c.price))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push_str(&layouts_table(q, a));
    match a.best() {
        None => out.push_str("\nno layout meets the targets with these candidates\n"),
        Some(l) => {
            out.push_str(&format!(
                "\ncheapest: {}, {} replicas, ${:.2}/hour\n\n",
                l.layout.label(),
                l.replicas(),
                l.cost_per_hour.unwrap_or(0.0)
            ));
            let mut t = Table::new([
                "pool",
                "lengths",
                "requests",
                "replicas",
                "TTFT p99",
                "ITL p99",
                "E2E p99",
                "one replica fewer misses",
            ]);
            for p in &l.pools {
                let Some((k, e)) = p.choice else { continue };
                t.row([
                    format!("{} ({})", p.name, q.candidates[k].label),
                    range_text(p.above, p.at_most),
                    pct(p.share),
                    e.replicas.to_string(),
                    s3(e.ttft_p99),
                    s3(e.itl_p99),
                    s3(e.e2e_p99),
                    binds_text(q, p.below.as_ref()),
                ]);
            }
            out.push_str(&t.render());
            // the pool that costs most sets most of the price
            if let Some(p) = l
                .pools
                .iter()
                .filter_map(|p| {
                    p.choice
                        .map(|(k, e)| (p, e.replicas as f64 * q.candidates[k].price))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|x| x.0)
            {
                out.push_str(&format!(
                    "binding: pool {} ({} of the cost; {})\n",
                    p.name,
                    pct(p
                        .choice
                        .map_or(0.0, |(k, e)| e.replicas as f64 * q.candidates[k].price)
                        / l.cost_per_hour.unwrap_or(1.0).max(1e-12)),
                    binds_text(q, p.below.as_ref())
                ));
            }
            if let Some((_, r)) = &a.fleet {
                let itl = r.itl();
                out.push_str(&format!(
                    "the fleet run whole ({} requests): TTFT p99 {}, ITL p99 {}, E2E p99 {}\n",
                    r.arrivals,
                    s3(pq(&r.lat.ttft, 0.99)),
                    s3(pq(&itl, 0.99)),
                    s3(pq(&r.lat.e2e, 0.99))
                ));
            }
        }
    }
    out.push_str("\nfewest replicas meeting the targets, per candidate:\n");
    let mut header = vec!["layout / pool".to_string()];
    header.extend(q.candidates.iter().map(|c| c.label.clone()));
    let mut t = Table::new(header);
    for l in &a.layouts {
        for p in &l.pools {
            let mut row = vec![format!("{} / {}", l.layout.label(), p.name)];
            row.extend(p.found.iter().map(found_text));
            if p.found.is_empty() {
                row.extend(q.candidates.iter().map(|_| "-".to_string()));
            }
            t.row(row);
        }
    }
    out.push_str(&t.render());
    let runs: usize = a
        .layouts
        .iter()
        .flat_map(|l| l.pools.iter())
        .map(|p| p.runs.len())
        .sum();
    out.push_str(&format!(
        "({runs} runs, pools shared by layouts counted once per layout)\n"
    ));
    if !s.whatif.is_empty() {
        out.push_str("\nwhat-if, the search at each rate:\n");
        let mut t = Table::new(["req/s", "cheapest", "replicas", "$/hour", "pools"]);
        for (rate, a) in &s.whatif {
            match a.best() {
                Some(l) => t.row([
                    crate::time::show(*rate),
                    l.layout.label(),
                    l.replicas().to_string(),
                    format!("{:.2}", l.cost_per_hour.unwrap_or(0.0)),
                    pools_text(q, l),
                ]),
                None => t.row([
                    crate::time::show(*rate),
                    "none meets".into(),
                    "-".into(),
                    "-".into(),
                    String::new(),
                ]),
            }
        }
        out.push_str(&t.render());
    }
    if !s.routers.is_empty() {
        out.push_str(&format!(
            "\nrouters, the cheapest fleet ({} requests):\n",
            s.routers[0].result.arrivals
        ));
        out.push_str(&routers_table(&s.routers));
    }
    out
}

fn routers_table(rs: &[RouterRun]) -> String {
    let mut t = Table::new([
        "between", "router", "TTFT p50", "TTFT p99", "ITL p99", "E2E p99",
    ]);
    for r in rs {
        let itl = r.result.itl();
        t.row([
            r.level.to_string(),
            r.name.clone(),
            s3(pq(&r.result.lat.ttft, 0.5)),
            s3(pq(&r.result.lat.ttft, 0.99)),
            s3(pq(&itl, 0.99)),
            s3(pq(&r.result.lat.e2e, 0.99)),
        ]);
    }
    t.render()
}

fn eval_json(e: &Eval, q: &Query) -> Value {
    json!({
        "replicas": e.replicas,
        "ttft_p99_s": num(e.ttft_p99),
        "itl_p99_s": num(e.itl_p99),
        "e2e_p99_s": num(e.e2e_p99),
        "measured": e.measured,
        "rejected": e.rejected,
        "stopped": e.stopped,
        "misses": e.misses(&q.slo),
    })
}

fn answer_json(q: &Query, a: &Answer) -> Value {
    json!({
        "best": a.best.map(|i| a.layouts[i].layout.label()),
        "layouts": a.layouts.iter().map(|l| json!({
            "layout": l.layout.label(),
            "replicas": l.replicas(),
            "cost_per_hour_usd": l.cost_per_hour.map(num),
            "pools": l.pools.iter().map(|p| json!({
                "name": p.name,
                "above_tokens": p.above,
                "at_most_tokens": p.at_most,
                "share": num(p.share),
                "candidate": p.choice.map(|(k, _)| q.candidates[k].label.clone()),
                "at": p.choice.map(|(_, e)| eval_json(&e, q)),
                "one_fewer": p.below.as_ref().map(|e| eval_json(e, q)),
                "per_candidate": p.found.iter().map(found_text).collect::<Vec<_>>(),
                "runs": p.runs.len(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "fleet": a.fleet.as_ref().map(|(_, r)| result_json(r)),
    })
}

fn search_json(s: &Search) -> Value {
    let q = &s.query;
    json!({
        "workload": s.workload_label,
        "rate": s.rate.map(num),
        "slo": {
            "ttft_p99_s": q.slo.ttft_p99.map(|t| num(to_secs(t))),
            "itl_p99_s": q.slo.itl_p99.map(|t| num(to_secs(t))),
            "e2e_p99_s": q.slo.e2e_p99.map(|t| num(to_secs(t))),
        },
        "seed": q.seed,
        "requests": q.requests,
        "candidates": q.candidates.iter().map(|c| json!({"label": c.label, "replica_hour_usd": num(c.price)})).collect::<Vec<_>>(),
        "answer": answer_json(q, &s.answer),
        "whatif": s.whatif.iter().map(|(r, a)| json!({"rate": num(*r), "answer": answer_json(q, a)})).collect::<Vec<_>>(),
        "routers": s.routers.iter().map(|r| json!({"between": r.level, "router": r.name, "result": result_json(&r.result)})).collect::<Vec<_>>(),
    })
}

/// The result tables of an outcome.
pub fn tables(o: &Outcome) -> Vec<Tbl> {
    match o {
        Outcome::Run(r) => vec![pools_table(&r.result, r)],
        Outcome::Search(s) => {
            let mut v = vec![runs_table(s), layouts_tbl(s)];
            if !s.whatif.is_empty() {
                v.push(whatif_tbl(s));
            }
            if !s.routers.is_empty() {
                v.push(routers_tbl(&s.routers));
            }
            v
        }
    }
}

fn pools_table(res: &FleetResult, r: &FileRun) -> Tbl {
    let mut name = Vec::new();
    let mut profile = Vec::new();
    let mut routed = Vec::new();
    let f = |k: usize| -> Vec<f64> { Vec::with_capacity(k) };
    let (mut t50, mut t99, mut i99, mut e99, mut hr, mut sv, mut cost) =
        (f(0), f(0), f(0), f(0), f(0), f(0), f(0));
    for (p, ps) in res.pools.iter().zip(&r.fleet.pools) {
        name.push(p.name.clone());
        profile.push(ps.profile_label.clone());
        routed.push(p.routed);
        t50.push(pq(&p.lat.ttft, 0.5));
        t99.push(pq(&p.lat.ttft, 0.99));
        i99.push(pq(&p.metrics.itl, 0.99));
        e99.push(pq(&p.lat.e2e, 0.99));
        hr.push(hit_ratio(&p.prefix));
        sv.push(p.prefix.saved_tokens as f64);
        cost.push(p.cost_usd);
    }
    Tbl {
        name: "pools",
        cols: vec![
            ("pool", Col::Str(name)),
            ("profile", Col::Str(profile)),
            ("routed", Col::U64(routed)),
            ("ttft_p50_s", Col::F64(t50)),
            ("ttft_p99_s", Col::F64(t99)),
            ("itl_p99_s", Col::F64(i99)),
            ("e2e_p99_s", Col::F64(e99)),
            ("prefix_hit_ratio", Col::F64(hr)),
            ("prefill_saved_tokens", Col::F64(sv)),
            ("cost_usd", Col::F64(cost)),
        ],
    }
}

fn runs_table(s: &Search) -> Tbl {
    let q = &s.query;
    let (mut layout, mut pool, mut cand) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reps, mut meas, mut rej) = (Vec::new(), Vec::new(), Vec::new());
    let (mut t99, mut i99, mut e99, mut meets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in &s.answer.layouts {
        for p in &l.pools {
            for (k, e) in &p.runs {
                layout.push(l.layout.label());
                pool.push(p.name.clone());
                cand.push(q.candidates[*k].label.clone());
                reps.push(e.replicas as u64);
                meas.push(e.measured);
                rej.push(e.rejected);
                t99.push(e.ttft_p99);
                i99.push(e.itl_p99);
                e99.push(e.e2e_p99);
                meets.push(e.misses(&q.slo).unwrap_or("meets").to_string());
            }
        }
    }
    Tbl {
        name: "runs",
        cols: vec![
            ("layout", Col::Str(layout)),
            ("pool", Col::Str(pool)),
            ("candidate", Col::Str(cand)),
            ("replicas", Col::U64(reps)),
            ("measured", Col::U64(meas)),
            ("rejected", Col::U64(rej)),
            ("ttft_p99_s", Col::F64(t99)),
            ("itl_p99_s", Col::F64(i99)),
            ("e2e_p99_s", Col::F64(e99)),
            ("verdict", Col::Str(meets)),
        ],
    }
}

fn layouts_tbl(s: &Search) -> Tbl {
    let q = &s.query;
    let (mut layout, mut pool, mut cand, mut reps, mut cost, mut best) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for (i, l) in s.answer.layouts.iter().enumerate() {
        for p in &l.pools {
            layout.push(l.layout.label());
            pool.push(p.name.clone());
            cand.push(
                p.choice
                    .map_or(String::new(), |(k, _)| q.candidates[k].label.clone()),
            );
            reps.push(p.replicas() as u64);
            cost.push(
                p.choice
                    .map_or(f64::NAN, |(k, e)| e.replicas as f64 * q.candidates[k].price),
            );
            best.push(
                if s.answer.best == Some(i) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            );
        }
    }
    Tbl {
        name: "layouts",
        cols: vec![
            ("layout", Col::Str(layout)),
            ("pool", Col::Str(pool)),
            ("candidate", Col::Str(cand)),
            ("replicas", Col::U64(reps)),
            ("cost_per_hour_usd", Col::F64(cost)),
            ("cheapest", Col::Str(best)),
        ],
    }
}

fn whatif_tbl(s: &Search) -> Tbl {
    let (mut rate, mut layout, mut reps, mut cost) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (r, a) in &s.whatif {
        rate.push(*r);
        match a.best() {
            Some(l) => {
                layout.push(l.layout.label());
                reps.push(l.replicas() as u64);
                cost.push(l.cost_per_hour.unwrap_or(f64::NAN));
            }
            None => {
                layout.push("none meets".into());
                reps.push(0);
                cost.push(f64::NAN);
            }
        }
    }
    Tbl {
        name: "whatif",
        cols: vec![
            ("rate", Col::F64(rate)),
            ("layout", Col::Str(layout)),
            ("replicas", Col::U64(reps)),
            ("cost_per_hour_usd", Col::F64(cost)),
        ],
    }
}

fn routers_tbl(rs: &[RouterRun]) -> Tbl {
    let (mut lv, mut nm, mut t50, mut t99, mut i99, mut e99) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for r in rs {
        lv.push(r.level.to_string());
        nm.push(r.name.clone());
        t50.push(pq(&r.result.lat.ttft, 0.5));
        t99.push(pq(&r.result.lat.ttft, 0.99));
        i99.push(pq(&r.result.itl(), 0.99));
        e99.push(pq(&r.result.lat.e2e, 0.99));
    }
    Tbl {
        name: "routers",
        cols: vec![
            ("between", Col::Str(lv)),
            ("router", Col::Str(nm)),
            ("ttft_p50_s", Col::F64(t50)),
            ("ttft_p99_s", Col::F64(t99)),
            ("itl_p99_s", Col::F64(i99)),
            ("e2e_p99_s", Col::F64(e99)),
        ],
    }
}

/// The search's P99 TTFT (or E2E, or ITL: the first target given) against
/// replicas, per pool and candidate: (title, y label, series of (name,
/// points), the target).
/// A search's curve: (title, y label, named series of (x, y), the target).
pub type Curve = (String, String, Vec<(String, Vec<(f64, f64)>)>, f64);

pub fn search_curves(s: &Search) -> Vec<Curve> {
    let q = &s.query;
    let (label, pick, target): (&str, fn(&Eval) -> f64, f64) = if let Some(t) = q.slo.ttft_p99 {
        ("TTFT p99 (s)", |e| e.ttft_p99, to_secs(t))
    } else if let Some(t) = q.slo.e2e_p99 {
        ("E2E p99 (s)", |e| e.e2e_p99, to_secs(t))
    } else {
        (
            "ITL p99 (s)",
            |e| e.itl_p99,
            to_secs(q.slo.itl_p99.unwrap_or(0)),
        )
    };
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for l in &s.answer.layouts {
        for p in &l.pools {
            if !seen.insert((p.above, p.at_most)) || p.runs.is_empty() {
                continue;
            }
            let mut series = Vec::new();
            for (k, c) in q.candidates.iter().enumerate() {
                let mut pts: Vec<(f64, f64)> = p
                    .runs
                    .iter()
                    .filter(|(kk, e)| *kk == k && !e.stopped && pick(e).is_finite())
                    .map(|(_, e)| (e.replicas as f64, pick(e)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                if !pts.is_empty() {
                    series.push((c.label.clone(), pts));
                }
            }
            out.push((
                format!("pool {} ({})", p.name, range_text(p.above, p.at_most)),
                label.to_string(),
                series,
                target,
            ));
        }
    }
    out
}
