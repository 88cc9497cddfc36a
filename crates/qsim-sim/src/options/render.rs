//! The options report: one row per option, then the cheapest one that
//! meets the targets (finished in time with no failed row, p95s); and the
//! report of the inverse search ([`super::fewest`]).

use super::fewest::{self, Found};
use super::{cheapest_meeting, OptionsFile, Outcome, Targets};
use crate::report::table::Table;
use crate::time::to_secs;

fn head(file: &OptionsFile, seed: u64) -> String {
    let b = &file.batch;
    let mut out = String::new();
    if !file.title.is_empty() {
        out.push_str(&format!("{}\n", file.title));
    }
    match &file.workload {
        None => out.push_str(&format!(
            "batch: {} rows of {}, {} workers, max_tokens {}; seed {seed}\n\n",
            b.rows, file.batch_file, b.workers, b.max_tokens
        )),
        Some(w) => out.push_str(&format!(
            "workload: {} arrivals at {} RPM{} for {:.0} s, max_tokens {}; seed {seed}\n\n",
            w.process.kind,
            w.rpm,
            match &w.process.shape {
                Some(s) => format!(" at the peak ({} shape)", s.kind),
                None => String::new(),
            },
            to_secs(w.duration),
            w.max_tokens
        )),
    }
    out
}

/// The hybrids beside the pure options: the cheapest of each that meets
/// `targets` (`(outcome, hybrid?, count words)`), and which wins.
fn hybrid_verdict(rows: &[(&Outcome, bool, String)], targets: &Targets) -> String {
    if !rows.iter().any(|r| r.1) {
        return String::new();
    }
    let best = |hybrid: bool| {
        rows.iter()
            .filter(|r| r.1 == hybrid && targets.missed(r.0).is_none())
            .filter(|r| r.0.cost_usd.is_some())
            .fold(None, |b: Option<&(&Outcome, bool, String)>, r| match b {
                Some(b) if b.0.cost_usd <= r.0.cost_usd => Some(b),
                _ => Some(r),
            })
    };
    let name = |r: &(&Outcome, bool, String)| {
        format!("{}{} (${:.2})", r.0.name, r.2, r.0.cost_usd.unwrap_or(0.0))
    };
    let mut out = String::new();
    // each hybrid against its parts alone (the pure options of its upstreams' profiles)
    for h in rows
        .iter()
        .filter(|r| r.1 && targets.missed(r.0).is_none() && r.0.cost_usd.is_some())
    {
        let part = rows
            .iter()
            .filter(|p| {
                !p.1 && targets.missed(p.0).is_none()
                    && p.0.cost_usd.is_some()
                    && !p.0.profiles.is_empty()
                    && p.0.profiles.iter().all(|x| h.0.profiles.contains(x))
            })
            .fold(None, |b: Option<&(&Outcome, bool, String)>, r| match b {
                Some(b) if b.0.cost_usd <= r.0.cost_usd => Some(b),
                _ => Some(r),
            });
        let (hc, what) = (h.0.cost_usd.unwrap_or(0.0), name(h));
        out.push_str(&match part {
            None => format!("  {what}: none of its upstreams alone meets the targets\n"),
            Some(p) => {
                let pc = p.0.cost_usd.unwrap_or(0.0);
                let (pct, dir) = if hc < pc {
                    ((1.0 - hc / pc) * 100.0, "below")
                } else {
                    ((hc / pc.max(1e-12) - 1.0) * 100.0, "above")
                };
                format!(
                    "  {what}: {pct:.0} % {dir} the cheapest of its upstreams alone, {}\n",
                    name(p)
                )
            }
        });
    }
    let overall: String = match (best(true), best(false)) {
        (None, _) => "no hybrid meets the targets\n".into(),
        (Some(h), None) => format!(
            "cheapest hybrid: {}; no pure option meets the targets\n",
            name(h)
        ),
        (Some(h), Some(p)) => {
            let (hc, pc) = (h.0.cost_usd.unwrap_or(0.0), p.0.cost_usd.unwrap_or(0.0));
            if hc < pc {
                format!(
                    "cheapest hybrid: {}, {:.0} % below the cheapest pure option {}\n",
                    name(h),
                    (1.0 - hc / pc) * 100.0,
                    name(p)
                )
            } else {
                format!(
                    "no hybrid wins: the cheapest hybrid {} costs {:.0} % more than the cheapest pure option {}\n",
                    name(h),
                    (hc / pc.max(1e-12) - 1.0) * 100.0,
                    name(p)
                )
            }
        }
    };
    overall + &out
}

/// The report of `outcomes` (of `file`, run with `seed`); the verdict
/// (cheapest meeting `targets`) when any target is set.
pub fn render(file: &OptionsFile, outcomes: &[Outcome], seed: u64, targets: &Targets) -> String {
    let mut out = head(file, seed);
    let spills = outcomes.iter().any(|o| o.spilled.is_some());
    let mut head_row = vec![
        "option",
        "kind",
        "done (s)",
        "ok",
        "failed",
        "429s",
        "TTFT p95 (s)",
        "E2E p95 (s)",
        "cost ($)",
    ];
    if spills {
        head_row.insert(5, "spilled");
    }
    let mut t = Table::new(head_row);
    for o in outcomes {
        let mut row = vec![
            o.name.clone(),
            o.kind.clone(),
            format!("{:.1}", to_secs(o.elapsed)),
            o.ok.to_string(),
            o.failed.to_string(),
            o.http_429.to_string(),
            o.ttft_p95_s.map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.2}", o.e2e_p95_s),
            o.cost_usd.map_or("-".into(), |c| format!("{c:.4}")),
        ];
        if spills {
            row.insert(5, o.spilled.map_or("-".into(), |x| x.to_string()));
        }
        t.row(row);
    }
    out.push_str(&t.render());
    if targets.any() {
        out.push('\n');
        let t = targets.describe();
        match cheapest_meeting(outcomes, targets) {
            Some(o) => out.push_str(&format!(
                "cheapest {t}: {} (${:.4})\n",
                o.name,
                o.cost_usd.unwrap_or(0.0)
            )),
            None => out.push_str(&format!(
                "no priced option {}\n",
                t.replacen("finishing", "finished", 1)
            )),
        }
        let rows: Vec<(&Outcome, bool, String)> = outcomes
            .iter()
            .map(|o| (o, o.spilled.is_some(), String::new()))
            .collect();
        out.push_str(&hybrid_verdict(&rows, targets));
    }
    out
}

/// The report of the inverse search: one row per option (its knob, the
/// count in the file, the fewest found, the runs, the run at that count and
/// why one fewer missed), then the cheapest row meeting `targets`.
pub fn render_fewest(file: &OptionsFile, found: &[Found], seed: u64, targets: &Targets) -> String {
    let mut out = head(file, seed);
    out.push_str(&format!(
        "fewest units, replicas or autoscale.min {}\n(doubling, then bisection; assumes more never hurts){}\n\n",
        targets.describe(),
        if found.iter().any(|f| f.mix) {
            "; a hybrid: its cheapest mix"
        } else {
            ""
        }
    ));
    let mut t = Table::new([
        "option",
        "searched",
        "file",
        "fewest",
        "runs",
        "done (s)",
        "failed",
        "E2E p95 (s)",
        "cost ($)",
        "one fewer / why none",
    ]);
    for f in found {
        let o = &f.outcome;
        let shown = f.count.is_some() || f.knob.is_none();
        let dash = || "-".to_string();
        t.row([
            f.name.clone(),
            f.knob.map_or("-".into(), |k| k.field().to_string()),
            f.knob.map_or_else(dash, |_| f.from.to_string()),
            match (f.knob, f.count) {
                (None, _) => dash(),
                (Some(_), Some(n)) => n.to_string(),
                (Some(_), None) => "none".into(),
            },
            f.runs.to_string(),
            if shown {
                format!("{:.1}", to_secs(o.elapsed))
            } else {
                dash()
            },
            if shown { o.failed.to_string() } else { dash() },
            if shown {
                format!("{:.2}", o.e2e_p95_s)
            } else {
                dash()
            },
            match o.cost_usd {
                Some(c) if shown => format!("{c:.4}"),
                _ => dash(),
            },
            match (&f.below, f.knob) {
                _ if !f.none.is_empty() => f.none.clone(),
                _ if f.mix && f.count.is_some() => format!(
                    "cheapest mix{}",
                    o.spilled
                        .map_or(String::new(), |s| format!(", {s} spilled"))
                ),
                (Some((n, why)), _) => format!("{n}: {why}"),
                (None, None) => targets
                    .missed(o)
                    .map_or("as written".into(), |w| format!("as written: {w}")),
                (None, Some(_)) => dash(),
            },
        ]);
    }
    out.push_str(&t.render());
    let runs: u32 = found.iter().map(|f| f.runs).sum();
    out.push_str(&format!("\nsimulated runs: {runs}\n"));
    match fewest::cheapest(found, targets) {
        Some(f) => out.push_str(&format!(
            "cheapest meeting the targets: {}{} (${:.4})\n",
            f.name,
            match (f.knob, f.count) {
                (Some(k), Some(n)) => format!(" with {}", fewest::count_words(k, n)),
                _ => String::new(),
            },
            f.outcome.cost_usd.unwrap_or(0.0)
        )),
        None => out.push_str("no priced option meets the targets\n"),
    }
    let rows: Vec<(&Outcome, bool, String)> = found
        .iter()
        .filter(|f| f.meets(targets))
        .map(|f| {
            (
                &f.outcome,
                f.mix,
                match (f.knob, f.count) {
                    (Some(k), Some(n)) => format!(" with {}", fewest::count_words(k, n)),
                    _ => String::new(),
                },
            )
        })
        .collect();
    out.push_str(&hybrid_verdict(&rows, targets));
    out
}
