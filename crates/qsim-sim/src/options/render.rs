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
    out.push_str(&format!(
        "batch: {} rows of {}, {} workers, max_tokens {}; seed {seed}\n\n",
        b.rows, file.batch_file, b.workers, b.max_tokens
    ));
    out
}

/// The report of `outcomes` (of `file`, run with `seed`); the verdict
/// (cheapest meeting `targets`) when any target is set.
pub fn render(file: &OptionsFile, outcomes: &[Outcome], seed: u64, targets: &Targets) -> String {
    let mut out = head(file, seed);
    let mut t = Table::new([
        "option",
        "kind",
        "done (s)",
        "ok",
        "failed",
        "429s",
        "TTFT p95 (s)",
        "E2E p95 (s)",
        "cost ($)",
    ]);
    for o in outcomes {
        t.row([
            o.name.clone(),
            o.kind.clone(),
            format!("{:.1}", to_secs(o.elapsed)),
            o.ok.to_string(),
            o.failed.to_string(),
            o.http_429.to_string(),
            o.ttft_p95_s.map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.2}", o.e2e_p95_s),
            o.cost_usd.map_or("-".into(), |c| format!("{c:.4}")),
        ]);
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
    }
    out
}

/// The report of the inverse search: one row per option (its knob, the
/// count in the file, the fewest found, the runs, the run at that count and
/// why one fewer missed), then the cheapest row meeting `targets`.
pub fn render_fewest(file: &OptionsFile, found: &[Found], seed: u64, targets: &Targets) -> String {
    let mut out = head(file, seed);
    out.push_str(&format!(
        "fewest units, replicas or autoscale.min {}\n(doubling, then bisection; assumes more never hurts)\n\n",
        targets.describe()
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
    out
}
